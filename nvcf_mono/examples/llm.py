"""A tiny OpenAI-compatible "model" server: ``python -m nvcf_mono.examples.llm --port 8000``.

It speaks the OpenAI protocol the way vLLM or NIM servers do, with no weights and no downloads: the
answer is words drawn by a generator seeded with the prompt, so the same request always gets the same
text. ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/responses``
(text in; text out, or streamed as server-sent events with ``stream: true``), ``GET /v1/models`` and
``GET /v2/health/ready``. Tokens are whitespace-separated words; ``--tokens-per-second`` paces the
output (0: as fast as it can). A chat may ask for JSON (:mod:`.llm_json`) or offer tools
(:mod:`.llm_tools`). Errors answer in OpenAI's shape ``{"error": {"message", "type", ...}}``.

Register it as an LLM function with ``inferenceUrl: /v1/chat/completions``, ``containerImage: llm``,
and call it through the platform's OpenAI-compatible gateway (``/v1`` on the API port).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import os
import random
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from nvcf_mono.examples import MAX_BODY, arguments
from nvcf_mono.examples.llm_json import FormatError, json_answer, wanted_schema
from nvcf_mono.examples.llm_json import pieces as json_pieces
from nvcf_mono.examples.llm_tools import ToolError, chosen_tool, tools_of
from nvcf_mono.examples.serving import serve_http

WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "an",
    "be",
    "this",
    "which",
    "or",
    "are",
    "have",
    "not",
    "but",
    "one",
    "all",
    "were",
    "when",
    "there",
    "can",
    "more",
    "if",
    "out",
    "so",
    "what",
    "up",
    "about",
    "into",
    "than",
    "them",
    "some",
    "could",
    "time",
    "only",
    "new",
    "would",
    "other",
)
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS = 4096
EMBEDDING_DIMENSIONS = 16


class BadRequest(ValueError):
    """The request is not one this server can answer (400, OpenAI's ``invalid_request_error``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": None}}, status=status)


def count_tokens(text: str) -> int:
    return len(text.split())


def seeded(text: str) -> random.Random:
    """The generator behind every answer to ``text``: the same text, the same answer."""
    return random.Random(hashlib.sha256(text.encode()).digest())


def generate(prompt: str, limit: int) -> list[str]:
    """``limit`` words, the same for the same prompt."""
    rng = seeded(prompt)
    return [rng.choice(WORDS) for _ in range(limit)]


def usage(prompt: str, completion: int) -> dict[str, int]:
    p = count_tokens(prompt)
    return {"prompt_tokens": p, "completion_tokens": completion, "total_tokens": p + completion}


def _whole_number(doc: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """``doc[name]``: None when absent, else a whole number from ``low`` to ``high`` (true and false are not)."""
    value = doc.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
        raise BadRequest(f"'{name}' must be a whole number from {low} to {high}", name)
    return value


def _max_tokens(doc: dict[str, Any], *names: str) -> int:
    for name in names:
        value = _whole_number(doc, name, 1, MAX_TOKENS)
        if value is not None:
            return value
    return DEFAULT_MAX_TOKENS


#: OpenAI's ranges for the sampling settings: a value outside is a 400, as OpenAI and vLLM answer it.
SAMPLING_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


def _sampling(doc: dict[str, Any]) -> None:
    """The sampling settings a call sends have OpenAI's types and ranges (this model ignores them)."""
    for name, (low, high) in SAMPLING_RANGES.items():
        value = doc.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise BadRequest(f"'{name}' must be a number from {low:g} to {high:g}, not {value!r}", name)
    seed = doc.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"'seed' must be a whole number, not {seed!r}", "seed")
    stop = doc.get("stop")
    if not (stop is None or isinstance(stop, str) or _strings(stop, most=4)):
        raise BadRequest("'stop' must be a string or a list of up to 4 strings", "stop")
    _include_usage(doc)


def _strings(value: Any, *, most: int) -> bool:
    return isinstance(value, list) and len(value) <= most and all(isinstance(v, str) for v in value)


def _include_usage(doc: dict[str, Any]) -> bool:
    """``stream_options.include_usage``, checked as OpenAI checks it (an object; a boolean)."""
    options = doc.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise BadRequest(f"'stream_options' must be an object, not {options!r}", "stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise BadRequest("'stream_options.include_usage' must be true or false", "stream_options.include_usage")
    return include


def _one_choice(doc: dict[str, Any]) -> None:
    """The model writes one answer per request: ``n`` above 1 is refused, not silently ignored."""
    n = doc.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise BadRequest("'n' must be 1: this model writes one choice per request", "n")


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of ``{"type": "text"|"input_text", "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") in ("text", "input_text")]
        if all(isinstance(t, str) for t in texts):
            return " ".join(t for t in texts if isinstance(t, str))
    raise BadRequest(f"'{where}' must be text or a list of text parts", where)


#: Every word is drawn with the same chance, so this is each token's true log probability.
TOKEN_LOGPROB = -math.log(len(WORDS))


def _alternatives(token: str, k: int) -> list[str]:
    """The ``k`` likeliest tokens at a token's place: all are equally likely, the drawn one first."""
    space = " " if token.startswith(" ") else ""
    others = [space + w for w in WORDS if space + w != token]
    return [token, *others][:k]


def chat_logprobs(doc: dict[str, Any]) -> int | None:
    """How many alternatives per token a chat call asks for (``top_logprobs``), or None for no logprobs."""
    wanted = doc.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise BadRequest("'logprobs' must be true or false", "logprobs")
    top = _whole_number(doc, "top_logprobs", 0, 20)
    if top is not None and not wanted:
        raise BadRequest("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
    return (top or 0) if wanted else None


def completion_logprobs(doc: dict[str, Any]) -> int | None:
    """``logprobs`` of a completions call: how many alternatives per token (0 to 5), or None."""
    return _whole_number(doc, "logprobs", 0, 5)


def chat_token_logprob(token: str, k: int) -> dict[str, Any]:
    def entry(t: str) -> dict[str, Any]:
        return {"token": t, "logprob": TOKEN_LOGPROB, "bytes": list(t.encode())}

    return {**entry(token), "top_logprobs": [entry(t) for t in _alternatives(token, k)]}


def completion_echo(doc: dict[str, Any]) -> bool:
    """``echo`` of a completions call (each answer after its prompt), with the fields beside it checked as
    OpenAI checks them: ``best_of`` (any number gives the one answer here: the model is deterministic)
    and ``suffix``, refused as vLLM refuses it rather than ignored.
    """
    echo = doc.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise BadRequest("'echo' must be true or false", "echo")
    if echo and doc.get("logprobs") is not None:
        raise BadRequest("'echo' with 'logprobs' is not supported by this model", "echo")
    _whole_number(doc, "best_of", 1, 20)
    if doc.get("suffix") is not None:
        raise BadRequest("'suffix' is not supported by this model", "suffix")
    return bool(echo)


def completion_token_logprobs(tokens: list[str], k: int, offset: int) -> dict[str, Any]:
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [TOKEN_LOGPROB] * len(tokens),
        "top_logprobs": [dict.fromkeys(_alternatives(t, k), TOKEN_LOGPROB) for t in tokens],
        "text_offset": offsets,
    }


def chat_prompt(doc: dict[str, Any]) -> str:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content}", "messages")
    parts = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'", "messages")
        content = message.get("content", "")
        if content is None and message["role"] == "assistant":
            content = ""  # a turn that called tools and said nothing
        parts.append(_text(content, f"messages[{i}].content"))
    return "\n".join(parts)


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int and t >= 0 for t in value)


def _as_texts(value: Any) -> list[str] | None:
    """A prompt or an embedding input as OpenAI takes it: a string, a list of strings, a list of token
    ids or a list of such lists. Token ids are written ``<id>``, one word (one token here) each.
    """
    if isinstance(value, str):
        return [value]
    if _token_ids(value):
        return [" ".join(f"<{t}>" for t in value)]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    if isinstance(value, list) and value and all(_token_ids(v) for v in value):
        return [" ".join(f"<{t}>" for t in v) for v in value]
    return None


def completion_prompts(doc: dict[str, Any]) -> list[str]:
    """One prompt per choice: OpenAI answers a list of prompts with a choice for each."""
    prompts = _as_texts(doc.get("prompt"))
    if prompts is None:
        raise BadRequest("'prompt' must be a string, a list of strings, token ids or lists of token ids", "prompt")
    return prompts


def responses_prompt(doc: dict[str, Any]) -> str:
    value = doc.get("input")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        return "\n".join(
            _text(item.get("content", ""), f"input[{i}].content") if isinstance(item, dict) else _text(item, "input")
            for i, item in enumerate(value)
        )
    raise BadRequest("'input' must be text or a list of messages", "input")


class Model:
    """The server's one model and its pace."""

    def __init__(self, name: str, tokens_per_second: float, instance: str = "local") -> None:
        self.name = name
        self.interval = 1.0 / tokens_per_second if tokens_per_second > 0 else 0.0
        #: OpenAI's system_fingerprint: here, which instance answered (its KV cache is per instance).
        self.fingerprint = f"fp_{instance}"

    async def paced(self, tokens: list[str]) -> AsyncIterator[str]:
        for token in tokens:
            if self.interval:
                await asyncio.sleep(self.interval)
            yield token


def words(prompt: str, limit: int) -> list[str]:
    """The answer to a prompt as tokens: its words, each after the first with its space."""
    return [word if i == 0 else " " + word for i, word in enumerate(generate(prompt, limit))]


def until_stop(tokens: list[str], doc: dict[str, Any]) -> tuple[list[str], str]:
    """The tokens before the first of the call's ``stop`` sequences, which is left out as OpenAI leaves it
    (the token it begins in is cut there), and the finish reason: ``stop`` where one was met, else ``length``.
    """
    stop = doc.get("stop")
    stops = [s for s in ([stop] if isinstance(stop, str) else stop or []) if s]
    text = "".join(tokens)
    cut = min((at for s in stops if (at := text.find(s)) >= 0), default=-1)
    if cut < 0:
        return tokens, "length"
    kept: list[str] = []
    for token in tokens:
        if cut <= len(token):
            return [*kept, token[:cut]] if cut else kept, "stop"
        kept.append(token)
        cut -= len(token)
    return kept, "stop"


def chat_answer(doc: dict[str, Any], prompt: str) -> tuple[list[str], str]:
    """A chat's tokens and its finish reason: words up to the limit, or the JSON it asked for."""
    names = ("max_completion_tokens", "max_tokens")
    limit = _max_tokens(doc, *names)
    try:
        schema = wanted_schema(doc)
    except FormatError as err:
        raise BadRequest(str(err), "response_format") from None
    if schema is None:
        return until_stop(words(prompt, limit), doc)
    if all(doc.get(name) is None for name in names):
        limit = MAX_TOKENS  # the whole document unless the caller set a limit
    rng = seeded(prompt)
    tokens = json_pieces(json_answer(schema, rng, WORDS))
    return (tokens[:limit], "length") if len(tokens) > limit else (tokens, "stop")


async def body_of(request: web.Request) -> dict[str, Any]:
    try:
        doc = json.loads(await request.read())
    except (ValueError, RecursionError) as err:  # RecursionError: nested too deep
        raise BadRequest(f"the body is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise BadRequest("the body must be a JSON object")
    if "model" in doc and not isinstance(doc["model"], str):
        raise BadRequest("'model' must be a string", "model")
    return doc


async def sse(request: web.Request, events: AsyncIterator[str]) -> web.StreamResponse:
    """Each item is one event's lines; ``data: [DONE]`` is the caller's to send."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    async for item in events:
        await response.write(f"{item}\n\n".encode())
    await response.write_eof()
    return response


def data(doc: dict[str, Any]) -> str:
    return "data: " + json.dumps(doc, separators=(",", ":"))


def _chunk_head(model: Model, cid: str, created: int) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model.name}


def _chunk(model: Model, cid: str, created: int, **choice: Any) -> str:
    doc = _chunk_head(model, cid, created)
    doc["system_fingerprint"] = model.fingerprint
    doc["choices"] = [{"index": 0, "logprobs": None, "finish_reason": None, **choice}]
    return data(doc)


def _usage_chunk(model: Model, cid: str, created: int, spent: dict[str, int]) -> str:
    """A chat stream's last chunk for ``stream_options.include_usage``: no choices, the usage."""
    return data({**_chunk_head(model, cid, created), "choices": [], "usage": spent})


def _chat_completion(
    model: Model, cid: str, created: int, choice: dict[str, Any], spent: dict[str, int]
) -> web.Response:
    return web.json_response(
        {
            "id": cid, "object": "chat.completion", "created": created, "model": model.name,
            "system_fingerprint": model.fingerprint, "choices": [choice], "usage": spent,
        }
    )  # fmt: skip


async def chat(model: Model, request: web.Request, doc: dict[str, Any]) -> web.StreamResponse:
    _one_choice(doc)
    prompt = chat_prompt(doc)
    rng = seeded(prompt)
    try:
        tool = chosen_tool(doc, tools_of(doc), rng)
    except ToolError as err:
        raise BadRequest(str(err), err.param) from None
    if tool is not None:
        return await tool_call(model, request, doc, prompt, tool=tool, rng=rng)
    answer, finish = chat_answer(doc, prompt)
    top = chat_logprobs(doc)
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def logprobs(tokens: list[str]) -> dict[str, Any] | None:
        return None if top is None else {"content": [chat_token_logprob(t, top) for t in tokens], "refusal": None}

    if doc.get("stream"):
        include_usage = _include_usage(doc)

        async def events() -> AsyncIterator[str]:
            yield _chunk(model, cid, created, delta={"role": "assistant", "content": ""})
            async for token in model.paced(answer):
                yield _chunk(model, cid, created, delta={"content": token}, logprobs=logprobs([token]))
            yield _chunk(model, cid, created, delta={}, finish_reason=finish)
            if include_usage:
                yield _usage_chunk(model, cid, created, usage(prompt, len(answer)))
            yield "data: [DONE]"

        return await sse(request, events())
    tokens = [t async for t in model.paced(answer)]
    message = {"role": "assistant", "content": "".join(tokens)}
    choice = {"index": 0, "message": message, "logprobs": logprobs(tokens), "finish_reason": finish}
    return _chat_completion(model, cid, created, choice, usage(prompt, len(tokens)))


async def tool_call(
    model: Model, request: web.Request, doc: dict[str, Any], prompt: str, *, tool: dict[str, Any], rng: random.Random
) -> web.StreamResponse:
    """A chat turn that calls ``tool``: its arguments a value of the tool's parameters schema."""
    arguments = json_pieces(json_answer(tool["parameters"], rng, WORDS))
    call_id, name = f"call_{uuid.uuid4().hex[:24]}", tool["name"]
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    spent = usage(prompt, len(arguments))
    if doc.get("stream"):
        include_usage = _include_usage(doc)

        async def events() -> AsyncIterator[str]:
            head = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            yield _chunk(model, cid, created, delta={"role": "assistant", "content": None, "tool_calls": [head]})
            async for piece in model.paced(arguments):
                yield _chunk(
                    model, cid, created, delta={"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                )
            yield _chunk(model, cid, created, delta={}, finish_reason="tool_calls")
            if include_usage:
                yield _usage_chunk(model, cid, created, spent)
            yield "data: [DONE]"

        return await sse(request, events())
    text = "".join([piece async for piece in model.paced(arguments)])
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
    return _chat_completion(model, cid, created, choice, spent)


async def completions(model: Model, request: web.Request, doc: dict[str, Any]) -> web.StreamResponse:
    _one_choice(doc)
    prompts, limit = completion_prompts(doc), _max_tokens(doc, "max_tokens")
    echo = completion_echo(doc)
    answers = [until_stop(words(prompt, limit), doc) for prompt in prompts]
    top = completion_logprobs(doc)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    head = {"id": cid, "object": "text_completion", "created": created, "model": model.name}
    total = usage("\n".join(prompts), sum(len(tokens) for tokens, _ in answers))

    def choice(index: int, tokens: list[str], finish: str | None, offset: int = 0) -> dict[str, Any]:
        logprobs = None if top is None or not tokens else completion_token_logprobs(tokens, top, offset)
        return {"index": index, "text": "".join(tokens), "logprobs": logprobs, "finish_reason": finish}

    if doc.get("stream"):
        include_usage = _include_usage(doc)

        async def events() -> AsyncIterator[str]:
            for index, (tokens, finish) in enumerate(answers):
                offset = 0
                if echo:
                    yield data({**head, "choices": [choice(index, [prompts[index]], None)]})
                async for token in model.paced(tokens):
                    yield data({**head, "choices": [choice(index, [token], None, offset)]})
                    offset += len(token)
                yield data({**head, "choices": [choice(index, [], finish)]})
            if include_usage:
                yield data({**head, "choices": [], "usage": total})
            yield "data: [DONE]"

        return await sse(request, events())
    choices = [
        choice(i, ([prompts[i]] if echo else []) + [t async for t in model.paced(tokens)], finish)
        for i, (tokens, finish) in enumerate(answers)
    ]
    return web.json_response({**head, "choices": choices, "usage": total})


def embedding(text: str, dimensions: int) -> list[float]:
    """A unit vector, the same for the same text."""
    rng = seeded(text)
    vector = [rng.gauss(0, 1) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


async def embeddings(model: Model, request: web.Request, doc: dict[str, Any]) -> web.StreamResponse:
    inputs = _as_texts(doc.get("input"))
    if inputs is None:
        raise BadRequest("'input' must be a string, a non-empty list of strings, token ids or lists of them", "input")
    dimensions = doc.get("dimensions", EMBEDDING_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= 4096:
        raise BadRequest("'dimensions' must be a whole number from 1 to 4096", "dimensions")
    encoding = doc.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    items = []
    for i, text in enumerate(inputs):
        vector = embedding(text, dimensions)
        value: Any = vector
        if encoding == "base64":  # what OpenAI's Python client asks for: little-endian float32
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        items.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(count_tokens(t) for t in inputs)
    return web.json_response(
        {
            "object": "list",
            "data": items,
            "model": model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _message(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _response_doc(
    model: Model, rid: str, created: int, *, text: str, status: str, prompt: str, n: int
) -> dict[str, Any]:
    item = _message(f"msg_{rid}", status, [_text_part(text)])
    doc: dict[str, Any] = {
        "id": f"resp_{rid}", "object": "response", "created_at": created, "status": status, "model": model.name,
        "output": [item] if text or status == "completed" else [], "error": None, "incomplete_details": None,
        "instructions": None, "metadata": {}, "parallel_tool_calls": False, "temperature": 1.0, "tool_choice": "auto",
        "tools": [], "top_p": 1.0,
    }  # fmt: skip
    if status == "completed":
        p = count_tokens(prompt)
        doc["usage"] = {"input_tokens": p, "output_tokens": n, "total_tokens": p + n}
    return doc


def _as_chat(doc: dict[str, Any]) -> dict[str, Any]:
    """A response call's limit and format (``text.format``) as a chat names them."""
    fmt = doc.get("text", {}).get("format") if isinstance(doc.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":  # name and schema beside the type
        fmt = {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return {"max_tokens": doc.get("max_output_tokens"), "response_format": fmt}


async def responses(model: Model, request: web.Request, doc: dict[str, Any]) -> web.StreamResponse:
    prompt = responses_prompt(doc)
    if doc.get("max_output_tokens") is not None:
        _max_tokens(doc, "max_output_tokens")  # refused in its own name
    try:
        answer, _ = chat_answer(_as_chat(doc), prompt)
    except BadRequest as err:  # the format, named as this API names it
        message = str(err).replace("'response_format.json_schema'", "'text.format'")
        raise BadRequest(message.replace("'response_format'", "'text.format'"), "text.format") from None
    limit = len(answer)
    rid, created = uuid.uuid4().hex, int(time.time())
    if not doc.get("stream"):
        text = "".join([t async for t in model.paced(answer)])
        return web.json_response(
            _response_doc(model, rid, created, text=text, status="completed", prompt=prompt, n=limit)
        )

    async def events() -> AsyncIterator[str]:
        seq = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal seq
            seq += 1
            return f"event: {kind}\n" + data({"type": kind, "sequence_number": seq - 1, **fields})

        # The whole sequence OpenAI sends: clients (the Python SDK's ``responses.stream``) build the
        # response from the item and part events and refuse a delta for an item never announced.
        started = _response_doc(model, rid, created, text="", status="in_progress", prompt=prompt, n=0)
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        item_id = f"msg_{rid}"
        yield event("response.output_item.added", output_index=0, item=_message(item_id, "in_progress", []))
        at: dict[str, Any] = {"item_id": item_id, "output_index": 0, "content_index": 0}
        yield event("response.content_part.added", **at, part=_text_part(""))
        text = ""
        async for token in model.paced(answer):
            text += token
            yield event("response.output_text.delta", **at, delta=token, logprobs=[])
        yield event("response.output_text.done", **at, text=text, logprobs=[])
        yield event("response.content_part.done", **at, part=_text_part(text))
        yield event(
            "response.output_item.done", output_index=0, item=_message(item_id, "completed", [_text_part(text)])
        )
        yield event(
            "response.completed",
            response=_response_doc(model, rid, created, text=text, status="completed", prompt=prompt, n=limit),
        )

    return await sse(request, events())


Handler = Callable[[Model, web.Request, dict[str, Any]], Any]


def app(model: Model) -> web.Application:
    """The server's routes."""

    def endpoint(handler: Handler) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                doc = await body_of(request)
                if doc.get("model", model.name) != model.name:  # as vLLM does: a model it does not serve is a 404
                    message = f"The model '{doc['model']}' does not exist; this server serves '{model.name}'."
                    return error(404, message, param="model")
                _sampling(doc)
                result: web.StreamResponse = await handler(model, request, doc)
                return result
            except BadRequest as err:
                return error(400, str(err), param=err.param)

        return handle

    async def models(request: web.Request) -> web.Response:
        card = {"id": model.name, "object": "model", "created": 0, "owned_by": "nvcf-mono"}
        return web.json_response({"object": "list", "data": [card]})

    async def ready(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready"})

    application = web.Application(client_max_size=MAX_BODY)
    for path, handler in (
        ("/v1/chat/completions", chat),
        ("/v1/completions", completions),
        ("/v1/embeddings", embeddings),
        ("/v1/responses", responses),
    ):
        application.router.add_post(path, endpoint(handler))
    application.router.add_get("/v1/models", models)
    application.router.add_get("/v2/health/ready", ready)
    application.router.add_get("/health", ready)
    return application


def main() -> None:
    """Serve until interrupted."""
    parser = arguments(__doc__)
    parser.add_argument("--model", default="tiny-llm", help="the model name it serves (default: tiny-llm)")
    parser.add_argument("--tokens-per-second", type=float, default=100.0, help="output pace; 0: unpaced")
    args = parser.parse_args()
    instance = os.environ.get("NVCF_INSTANCE_ID") or "local"  # noqa: TID251 - the instance contract
    model = Model(args.model, args.tokens_per_second, instance)
    serve_http(app(model), args)


if __name__ == "__main__":
    main()
