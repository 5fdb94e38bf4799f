"""What the CLI prints of values it did not write: one line each, nothing a terminal would run."""

from __future__ import annotations

import io

from nvcf_mono.cli.context import CliContext
from nvcf_mono.cli.output import cell, fields, table


def _ctx() -> tuple[CliContext, io.StringIO]:
    out = io.StringIO()
    return CliContext(environ={}, stdout=out, stderr=io.StringIO(), run_host=lambda *_: 1), out


def test_a_tenants_text_is_one_line_with_its_control_characters_shown() -> None:
    # A function's description is free text: another account's admin may print it.
    description = "line1\nFORGED\x1b[2J\x1b]0;title\x07\x9b31m\u2028end"
    assert cell(description) == "line1 FORGED\\x1b[2J\\x1b]0;title\\x07\\x9b31m end"  # line breaks: spaces
    ctx, out = _ctx()
    fields(ctx, [("name", "esc"), ("description", description)])
    table(ctx, ("NAME", "DESCRIPTION"), [("esc", description)], empty="none")
    printed = out.getvalue()
    assert len(printed.splitlines()) == 4
    assert not any(ch in printed for ch in "\x1b\x07\x9b\u2028\r")


def test_plain_values_print_as_they_are() -> None:
    assert cell("ACTIVE") == "ACTIVE"
    assert cell("  two   words\t") == "two words"
    assert cell(["a", "b"]) == "a, b"
    assert cell({"k": "v"}) == "k=v"
    assert cell(None) == "-" and cell(True) == "yes"
