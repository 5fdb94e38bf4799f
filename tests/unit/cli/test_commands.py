"""The command table and the parser built from it: every command listed, each module registering its own."""

from __future__ import annotations

import argparse
import importlib
import io
from pathlib import Path

import pytest

from nvcf_mono import __version__
from nvcf_mono.cli import COMMAND_MODULES, build_parser, chosen_command, main, options_after_command
from nvcf_mono.cli.commands import COMMANDS
from nvcf_mono.cli.context import CliContext


def _unused_host(*_: object) -> int:
    raise AssertionError("no host is started here")


def _ctx(environ: dict[str, str] | None = None) -> tuple[CliContext, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return CliContext(environ=environ or {}, stdout=out, stderr=err, run_host=_unused_host), out, err


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action


def test_each_module_registers_exactly_the_commands_the_table_gives_it() -> None:
    for module in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        expected = [(c.name, c.help) for c in COMMANDS if c.module == module]
        assert [(a.dest, a.help) for a in sub._choices_actions] == expected, module


def test_the_full_parser_and_the_lazy_one_list_the_same_commands() -> None:
    ctx, _, _ = _ctx()
    table = [(c.name, c.help) for c in COMMANDS]
    full = _commands(build_parser(ctx))
    assert [(a.dest, a.help) for a in full._choices_actions] == table
    listed_only = _commands(build_parser(ctx, modules=()))
    assert [(a.dest, a.help) for a in listed_only._choices_actions] == table
    assert len({c.name for c in COMMANDS}) == len(COMMANDS)


def test_help_lists_every_command_on_the_contexts_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    ctx, out, err = _ctx()
    assert main(["--help"], ctx) == 0
    for command in COMMANDS:
        assert f"    {command.name}" in out.getvalue()
    assert err.getvalue() == ""
    ctx, out, _ = _ctx()
    assert main(["--version"], ctx) == 0
    assert out.getvalue() == f"nvcf-mono {__version__}\n"
    assert capsys.readouterr() == ("", "")  # nothing went to the process's own streams


def test_usage_errors_exit_2_on_the_contexts_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    ctx, out, err = _ctx()
    assert main(["bogus"], ctx) == 2
    assert "invalid choice: 'bogus'" in err.getvalue() and out.getvalue() == ""
    ctx, out, err = _ctx()
    assert main(["function", "create", "--image", "i", "--helm-chart", "c"], ctx) == 2
    assert err.getvalue().startswith("usage: nvcf-mono function create")
    assert "not allowed with argument" in err.getvalue()
    ctx, out, err = _ctx()
    assert main(["deploy", "create", "--help"], ctx) == 0
    assert out.getvalue().startswith("usage: nvcf-mono deploy create") and err.getvalue() == ""
    ctx, out, err = _ctx()
    assert main([], ctx) == 2
    assert out.getvalue().startswith("usage: nvcf-mono") and err.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_a_command_runs_with_the_context_it_is_given() -> None:
    ctx, out, err = _ctx({"NVCF_API_URL": "ftp://example.com", "NVCF_TOKEN": "t"})
    assert main(["function", "list"], ctx) == 2
    assert err.getvalue() == (
        "nvcf-mono: env NVCF_API_URL 'ftp://example.com': expected an http:// or https:// URL, "
        "e.g. http://127.0.0.1:8080\n"
    )
    assert out.getvalue() == ""


@pytest.mark.parametrize("bad", ["a b", "x?y=1", "..", "%2e%2e", "fid#frag", "a" * 300])
@pytest.mark.parametrize(
    "command",
    [
        ["function", "get", "{}"],
        ["deploy", "get", "{}", "v"],
        ["invoke", "{}", "-d", "{{}}"],
        ["instance", "logs", "{}"],
        ["task", "get", "{}"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_an_id_no_path_can_hold_is_refused_before_anything_is_sent(command: list[str], bad: str) -> None:
    # Nothing listens on port 9 here: a request that went out would fail to connect (exit 1), or, with a
    # space in the URL, raise in urllib.
    ctx, out, err = _ctx({"NVCF_API_URL": "http://127.0.0.1:9", "NVCF_TOKEN": "t"})
    assert main([part.format(bad) for part in command], ctx) == 2
    shown = bad if len(bad) <= 64 else bad[:64] + "..."
    assert err.getvalue() == (
        f"nvcf-mono: {shown!r} is not a valid id: ids have at most 256 letters, digits, '-', '_' and single '.'\n"
    )
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        ([], None),
        (["--help"], None),
        (["function", "list", "--json"], "function"),
        (["--version", "up"], "up"),
        (["api-key", "--help"], "api-key"),
    ],
)
def test_the_chosen_command_is_the_first_word(argv: list[str], command: str | None) -> None:
    assert chosen_command(argv) == command


@pytest.mark.parametrize(
    ("argv", "rewritten"),
    [
        (["--state-dir", "/s", "function", "list"], ["function", "list", "--state-dir", "/s"]),
        (
            ["--state-dir=/s", "--token", "t", "invoke", "F", "-d", "{}"],
            ["invoke", "F", "--state-dir=/s", "--token", "t", "-d", "{}"],
        ),
        (["function", "list", "--state-dir", "/s"], ["function", "list", "--state-dir", "/s"]),
        (["--help"], ["--help"]),
        (["--state-dir"], ["--state-dir"]),
    ],
)
def test_connection_options_before_the_command_move_after_its_words(argv: list[str], rewritten: list[str]) -> None:
    assert options_after_command(argv) == rewritten


def test_a_state_dir_before_the_command_is_the_commands(tmp_path: Path) -> None:
    ctx, _, err = _ctx()
    # An empty state directory: the command says it found no platform there (not "invalid choice").
    assert main(["--state-dir", str(tmp_path), "function", "list"], ctx) == 2
    assert str(tmp_path) in err.getvalue() and "invalid choice" not in err.getvalue(), err.getvalue()
