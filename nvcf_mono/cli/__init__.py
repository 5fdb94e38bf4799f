"""The ``nvcf-mono`` command line. Commands are listed in :data:`~nvcf_mono.cli.commands.COMMANDS`.

Only the module of the command being run is imported; the others appear in ``--help`` from the table
alone. Everything argparse prints goes to the context's streams and its exits become return codes,
so :func:`main` runs the same in-process (tests) as in the console script.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from nvcf_mono import __version__
from nvcf_mono.cli.commands import COMMANDS
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.printable import one_line

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

#: Every command module, in help order.
COMMAND_MODULES = tuple(dict.fromkeys(command.module for command in COMMANDS))


def _parser_class(ctx: CliContext) -> type[argparse.ArgumentParser]:
    """An ArgumentParser that prints to ``ctx``'s streams rather than the process's."""

    class Parser(argparse.ArgumentParser):
        def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
            if not message:
                return
            if file is None or file is sys.stderr:
                file = ctx.stderr
            elif file is sys.stdout:
                file = ctx.stdout
            file.write(message)

    return Parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command named on the command line (the top level has no option that takes a value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


#: The API connection options every client command takes (``add_api_options``), with a value.
_CONNECTION = frozenset({"--state-dir", "--api-url", "--token", "--api-key"})


def options_after_command(argv: Sequence[str]) -> list[str]:
    """``argv`` with connection options given before the command (``nvcf-mono --state-dir D function list``,
    as many CLIs allow) moved after its words (``function list --state-dir D``), where they belong.
    """
    moved: list[str] = []
    rest = list(argv)
    while rest and rest[0].partition("=")[0] in _CONNECTION:
        option = rest.pop(0)
        moved.append(option)
        if "=" not in option and rest:
            moved.append(rest.pop(0))
    if not moved:
        return rest
    words = next((i for i, arg in enumerate(rest) if arg.startswith("-")), len(rest))
    return [*rest[:words], *moved, *rest[words:]]


def build_parser(ctx: CliContext, modules: Collection[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """The parser, with the commands of ``modules`` complete and the others only listed."""
    parser = _parser_class(ctx)(
        prog="nvcf-mono",
        description="nvcf-mono: a serverless GPU function platform in the shape of NVIDIA Cloud Functions.",
    )
    parser.add_argument("--version", action="version", version=f"nvcf-mono {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    registered: set[str] = set()
    for command in COMMANDS:
        if command.module not in modules:
            sub.add_parser(command.name, help=command.help, add_help=False)
        elif command.module not in registered:
            importlib.import_module(command.module).register(sub)
            registered.add(command.module)
    return parser


def main(argv: Sequence[str], ctx: CliContext) -> int:
    """Run one command; returns the exit code (2 for usage and configuration errors)."""
    argv = options_after_command(argv)
    name = chosen_command(argv)
    parser = build_parser(ctx, {c.module for c in COMMANDS if c.name == name})
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as stop:  # --help and --version (0) or a usage error (2), already printed
        return stop.code if isinstance(stop.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help(ctx.stdout)
        return 2
    try:
        code: int = args.func(args, ctx)
    except CliError as err:
        # A message may quote a server (a shared function's own error text): shown, never obeyed.
        for line in str(err).splitlines():
            print(f"nvcf-mono: {one_line(line)}", file=ctx.stderr)
        return err.code
    except KeyboardInterrupt:
        return 130
    return code


__all__ = ["CliContext", "CliError", "build_parser", "main"]
