"""Tool calls for the tiny example model: OpenAI's ``tools`` and ``tool_choice`` in a chat.

The model calls a tool the way an agent loop expects: with ``tool_choice`` ``"auto"`` (the default when
tools are given) it calls one of them until a tool's result is the last message, and then answers in
words; ``"required"`` or a named function always calls; ``"none"`` never does. The arguments are a value
of the tool's ``parameters`` schema (:mod:`.llm_json`), drawn from the generator seeded with the prompt.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any


class ToolError(ValueError):
    """``tools`` or ``tool_choice`` is not one this model can follow (a 400 naming ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def tools_of(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The functions a chat offers (each ``{"name", "parameters"}``), checked as OpenAI checks them."""
    tools = doc.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ToolError("'tools' must be a list of {type: 'function', function: {name, parameters}}", "tools")
    functions = []
    for i, tool in enumerate(tools):
        spec = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ToolError(f"'tools[{i}]' must be {{type: 'function', function: {{name, parameters}}}}", "tools")
        parameters = spec.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ToolError(f"'tools[{i}].function.parameters' must be a JSON Schema object", "tools")
        functions.append({"name": spec["name"], "parameters": parameters})
    return functions


def chosen_tool(doc: Mapping[str, Any], tools: list[dict[str, Any]], rng: random.Random) -> dict[str, Any] | None:
    """The tool this turn calls, or None when it answers in words."""
    choice = doc.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise ToolError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if choice is None or choice == "auto":
        messages = doc.get("messages") or [{}]
        last = messages[-1] if isinstance(messages[-1], dict) else {}
        return None if last.get("role") == "tool" else rng.choice(tools)  # a result came back: answer
    if choice == "none":
        return None
    if choice == "required":
        return rng.choice(tools)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if isinstance(name, str):
        for tool in tools:
            if tool["name"] == name:
                return tool
        raise ToolError(f"'tool_choice' names the function {name!r}, which is not among 'tools'", "tool_choice")
    raise ToolError(
        "'tool_choice' must be 'none', 'auto', 'required' or {type: 'function', function: {name}}", "tool_choice"
    )
