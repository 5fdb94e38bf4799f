"""``nvcf-mono config show|check|reference``."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.common import add_config_options, load_or_fail, sources_from
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.structure import Text


def register(sub: Any) -> None:
    """Add ``config`` and its subcommands."""
    config = sub.add_parser("config", help=help_of("config"))
    cmds = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    show = cmds.add_parser("show", help="print the configuration you set, or all of it with --resolved")
    add_config_options(show)
    show.add_argument(
        "--resolved",
        action="store_true",
        help="the effective configuration: defaults, files, env and flags, plugins included",
    )
    show.add_argument("--json", action="store_true", help="JSON instead of YAML")
    show.add_argument("--show-secrets", action="store_true", help="do not mask secret values")
    show.set_defaults(func=_show)
    check = cmds.add_parser("check", help="validate the configuration; exit 2 listing every problem")
    add_config_options(check)
    check.set_defaults(func=_check)
    ref = cmds.add_parser("reference", help="print config/reference.yaml: every key, its default and purpose")
    ref.set_defaults(func=_reference)
    config.set_defaults(func=lambda args, ctx: (config.print_help(ctx.stdout), 2)[1])


def _plain(value: Any) -> Any:
    if isinstance(value, Text):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _emit(data: Any, as_json: bool, ctx: CliContext) -> None:
    if as_json:
        print(json.dumps(data, indent=2, default=str), file=ctx.stdout)
    else:
        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip(), file=ctx.stdout)


def _show(args: argparse.Namespace, ctx: CliContext) -> int:
    sources = sources_from(args, ctx)
    if args.resolved:
        _emit(load_or_fail(sources).to_data(redact=not args.show_secrets), args.json, ctx)
        return 0
    from nvcf_mono.config.load import gather  # the loader brings every plugin's model: only when used

    raw, _, issues = gather(sources)
    if issues:
        raise CliError("\n".join(f"config: {issue}" for issue in issues))
    _emit(_plain(raw), args.json, ctx)
    return 0


def _check(args: argparse.Namespace, ctx: CliContext) -> int:
    config = load_or_fail(sources_from(args, ctx))
    print(
        f"configuration is valid: role {config.settings.role}, plugins {', '.join(config.order) or 'none'}",
        file=ctx.stdout,
    )
    return 0


def _reference(args: argparse.Namespace, ctx: CliContext) -> int:
    from nvcf_mono.config.reference import render_reference
    from nvcf_mono.registry import discover

    catalog, issues = discover()
    if issues:
        raise CliError("\n".join(f"config: {issue}" for issue in issues))
    ctx.stdout.write(render_reference(catalog))
    return 0
