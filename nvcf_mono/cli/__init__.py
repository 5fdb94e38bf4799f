"""The ``nvcf-mono`` command line. Each subcommand module registers itself in :data:`COMMAND_MODULES`."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

from nvcf_mono import __version__
from nvcf_mono.cli.context import CliContext, CliError

#: Subcommand modules, in help order; each has ``register(subparsers)``. Planes add theirs here.
COMMAND_MODULES = (
    "nvcf_mono.cli.host_cmds",
    "nvcf_mono.cli.config_cmds",
    "nvcf_mono.cli.plugins_cmds",
    "nvcf_mono.cli.function_cmds",
    "nvcf_mono.cli.deploy_cmds",
    "nvcf_mono.cli.task_cmds",
    "nvcf_mono.cli.key_cmds",
    "nvcf_mono.cli.cluster_cmds",
    "nvcf_mono.cli.instance_cmds",
    "nvcf_mono.cli.secret_cmds",
    "nvcf_mono.cli.helm_cmds",
    "nvcf_mono.cli.worker_cmds",
    "nvcf_mono.cli.invoke_cmds",
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser."""
    parser = argparse.ArgumentParser(
        prog="nvcf-mono",
        description="nvcf-mono: a serverless GPU function platform in the shape of NVIDIA Cloud Functions.",
    )
    parser.add_argument("--version", action="version", version=f"nvcf-mono {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str], ctx: CliContext) -> int:
    """Run one command; returns the exit code (2 for usage and configuration errors)."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if not getattr(args, "func", None):
        parser.print_help(ctx.stdout)
        return 2
    try:
        code: int = args.func(args, ctx)
    except CliError as err:
        for line in str(err).splitlines():
            print(f"nvcf-mono: {line}", file=ctx.stderr)
        return err.code
    except KeyboardInterrupt:
        return 130
    return code


__all__ = ["CliContext", "CliError", "build_parser", "main"]
