"""Options shared by the commands that read configuration."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from nvcf_mono.cli.context import CliContext, CliError

if TYPE_CHECKING:
    from nvcf_mono.config.load import ConfigSources, ResolvedConfig


def add_config_options(parser: argparse.ArgumentParser, *, role: bool = True) -> None:
    """--config (repeatable), --state-dir, --role, --set, --log-level."""
    group = parser.add_argument_group("configuration")
    group.add_argument(
        "-c",
        "--config",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="YAML config file; repeat to layer files (later ones win, mappings merge)",
    )
    group.add_argument("--state-dir", metavar="DIR", help="state directory (default ./.nvcf-mono)")
    if role:
        group.add_argument(
            "--role",
            metavar="ROLE",
            help="all-in-one, control, invocation, compute or custom (overrides the files)",
        )
    group.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override one key, e.g. --set http.port=0 (repeatable; applied last)",
    )
    group.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="root log level")


def sources_from(args: argparse.Namespace, ctx: CliContext, *, forced_role: str | None = None) -> ConfigSources:
    """The config layers named by the command line."""
    from nvcf_mono.config.load import ConfigSources  # the loader and its plugin registry, only when used

    overrides: list[tuple[str, str, str]] = []
    if forced_role is not None:
        overrides.append(("role", forced_role, f"nvcf-mono {args.command}"))
    if getattr(args, "role", None):
        overrides.append(("role", args.role, "--role"))
    if args.state_dir:
        overrides.append(("state_dir", args.state_dir, "--state-dir"))
    if args.log_level:
        overrides.append(("logging.level", args.log_level, "--log-level"))
    if getattr(args, "tls", False):
        overrides.append(("tls.self_signed", "true", "--tls"))
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--set {item!r}: expected KEY=VALUE, e.g. --set http.port=0")
        overrides.append((key.strip(), value, f"--set {key.strip()}"))
    return ConfigSources(files=tuple(args.config), environ=ctx.environ, overrides=tuple(overrides))


def load_or_fail(sources: ConfigSources) -> ResolvedConfig:
    """Resolve the configuration, turning problems into a CLI error (exit 2, one line each)."""
    from nvcf_mono.config.load import ConfigError, load_config

    try:
        return load_config(sources)
    except ConfigError as err:
        raise CliError("\n".join(f"config: {issue}" for issue in err.issues)) from err
