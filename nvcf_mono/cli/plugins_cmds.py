"""``nvcf-mono plugins``: what is installed, and what the configuration enables."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.common import add_config_options, load_or_fail, sources_from
from nvcf_mono.cli.context import CliContext


def register(sub: Any) -> None:
    """Add ``plugins``."""
    plugins = sub.add_parser("plugins", help=help_of("plugins"))
    add_config_options(plugins)
    plugins.add_argument("--json", action="store_true", help="JSON output")
    plugins.set_defaults(func=_list)


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    config = load_or_fail(sources_from(args, ctx))
    rows: list[dict[str, Any]] = [
        {
            "name": entry.name,
            "enabled": entry.enabled,
            "why": entry.why,
            "roles": sorted(entry.spec.roles),
            "requires": list(entry.spec.requires),
            "origin": entry.origin,
            "description": entry.spec.description,
        }
        for entry in sorted(config.plugins.values(), key=lambda e: e.name)
    ]
    if args.json:
        print(json.dumps(rows, indent=2), file=ctx.stdout)
        return 0
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        mark = "on " if r["enabled"] else "off"
        print(f"{mark} {r['name']:<{width}}  {r['description']}  ({r['why']})", file=ctx.stdout)
    return 0
