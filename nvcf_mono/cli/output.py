"""How API commands print: raw JSON, aligned tables, aligned ``key: value`` lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from nvcf_mono.cli.context import CliContext
from nvcf_mono.printable import one_line


def emit_json(ctx: CliContext, data: Any) -> None:
    """The response as the API sent it, indented."""
    print(json.dumps(data, indent=2), file=ctx.stdout)


def cell(value: Any) -> str:
    """One value as a short, single-line string ('-' for nothing), control characters escaped: values
    come from tenants (a description, a server's error text) and must not reach a terminal as commands.
    """
    if value is None or value in ("", [], {}):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    return one_line(" ".join(str(value).split()))


def table(ctx: CliContext, headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str) -> None:
    """Columns aligned two spaces apart; ``empty`` is printed when there are no rows."""
    cells = [[cell(v) for v in row] for row in rows]
    if not cells:
        print(empty, file=ctx.stdout)
        return
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    for row in [list(headers), *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(), file=ctx.stdout)


def instances_table(ctx: CliContext, instances: Sequence[dict[str, Any]], *, state: str) -> None:
    """The instances of a function or a task, after a blank line; ``state`` names their state field."""
    if not instances:
        return
    print(file=ctx.stdout)
    table(
        ctx,
        ("INSTANCE ID", state.removeprefix("instance").upper(), "GPU", "INSTANCE TYPE", "BACKEND", "LOCATION"),
        (
            (
                i.get("instanceId"),
                i.get(state),
                i.get("gpu"),
                i.get("instanceType"),
                i.get("backend"),
                i.get("location"),
            )
            for i in instances
        ),
        empty="",
    )


def fields(ctx: CliContext, pairs: Iterable[tuple[str, Any]]) -> None:
    """``key: value`` lines with the values aligned; pairs whose value is None are left out."""
    shown = [(k, cell(v)) for k, v in pairs if v is not None]
    width = max((len(k) for k, _ in shown), default=0) + 1
    for key, value in shown:
        print(f"{key + ':':<{width}} {value}", file=ctx.stdout)
