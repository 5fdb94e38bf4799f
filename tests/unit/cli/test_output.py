"""What the CLI prints of values it did not write: one line each, nothing a terminal would run."""

from __future__ import annotations

import io
import json

from nvcf_mono.cli import main
from nvcf_mono.cli.context import CliContext
from nvcf_mono.cli.output import cell, fields, table
from tests.support.http_thread import QuietHandler, serving


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


def test_a_servers_error_text_is_shown_not_obeyed() -> None:
    """An error's detail may be a shared function's own text, read by a caller of another account."""
    detail = "no such\x1b[2J\x1b]0;pwned\x07 thing\nsecond line"

    class Problem(QuietHandler):
        def do_GET(self) -> None:
            body = json.dumps({"status": 404, "title": "Not Found", "detail": detail}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/problem+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Problem) as url:
        err = io.StringIO()
        ctx = CliContext(
            environ={"NVCF_API_URL": url, "NVCF_TOKEN": "t"},
            stdout=io.StringIO(),
            stderr=err,
            run_host=lambda *_: 1,
        )
        assert main(["function", "get", "fid"], ctx) == 1
    printed = err.getvalue()
    assert "\x1b" not in printed and "\x07" not in printed
    assert "no such\\x1b[2J\\x1b]0;pwned\\x07 thing" in printed
    assert all(line.startswith("nvcf-mono: ") for line in printed.splitlines())


def test_a_deployments_failures_quote_the_instance_on_one_line() -> None:
    from nvcf_mono.cli.deploy_cmds import _health_lines

    info = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "backend": "local"}
    dep = {"healthInfo": [{**info, "error": "crashed:\n2026-12-06 ERROR forged\x1b[31m"}] * 2 + [info]}
    assert _health_lines(dep) == [
        "H100 ON-PREM.GPU.H100_1x on local: crashed: 2026-12-06 ERROR forged\\x1b[31m (x2)",
        "H100 ON-PREM.GPU.H100_1x on local: -",
    ]
