"""``nvcf-mono instance list|logs``: the instances that run functions, and what they print."""

from __future__ import annotations

import argparse
import time
from typing import Any

from nvcf_mono.cli.client import ApiClient, add_api_options, connect, positive_float
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json, table
from nvcf_mono.printable import on_terminal, one_line

LOG_NAMES = ("inference", "worker")
MAX_TAIL = 4 * 1024 * 1024
#: Instance states after which nothing more is written (``--follow`` stops there).
_GONE = ("terminated", "succeeded", "failed")


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def add_log_options(logs: argparse.ArgumentParser) -> None:
    """The options of ``instance logs``, which ``task logs`` shares."""
    logs.add_argument("--tail", type=non_negative, metavar="LINES", help="only the last LINES lines of each log")
    logs.add_argument(
        "--bytes",
        type=non_negative,
        default=64 * 1024,
        metavar="N",
        help="read at most the last N bytes of each log (default 65536, at most 4 MiB)",
    )
    logs.add_argument("--log", choices=LOG_NAMES, help="only this log (default: both, each under a header)")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing what is written until the instance ends (Ctrl-C)"
    )
    logs.add_argument(
        "--interval", type=positive_float, default=1.0, metavar="SECONDS", help="--follow polls this often (default 1)"
    )
    logs.add_argument(
        "--raw",
        action="store_true",
        help="print control characters as written, on a terminal too (by default a terminal gets them escaped, "
        "as \\x1b, since the function's server writes them; a pipe or a file always gets them as written)",
    )


def register(sub: Any) -> None:
    """Add ``instance`` and its subcommands."""
    instance = sub.add_parser("instance", help=help_of("instance"))
    cmds = instance.add_subparsers(dest="instance_command", metavar="SUBCOMMAND")
    instance.set_defaults(func=lambda args, ctx: (instance.print_help(ctx.stdout), 2)[1])

    listing = cmds.add_parser("list", help="list the account's instances (of a function, a version, a cluster)")
    listing.add_argument("--function", metavar="FUNCTION_ID", help="only this function's instances")
    listing.add_argument("--version", metavar="VERSION_ID", help="only this version's (needs --function)")
    listing.add_argument("--cluster", metavar="NAME_OR_ID", help="only instances on this cluster")
    add_api_options(listing)
    listing.set_defaults(func=_list)

    logs = cmds.add_parser("logs", help="print the end of an instance's logs (its server's and its worker's)")
    logs.add_argument("instance_id", metavar="INSTANCE_ID", help="see `instance list`")
    add_log_options(logs)
    add_api_options(logs)
    logs.set_defaults(func=show_logs)


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.version and not args.function:
        raise CliError("--version needs --function")
    client = connect(args, ctx)
    query = {
        k: v
        for k, v in (("functionId", args.function), ("functionVersionId", args.version), ("cluster", args.cluster))
        if v
    }
    doc = client.get("/v2/nvcf/instances", query=query or None)
    if args.json:
        emit_json(ctx, doc)
        return 0
    table(
        ctx,
        ("INSTANCE ID", "FUNCTION ID", "VERSION ID", "STATUS", "STATE", "CLUSTER", "INSTANCE TYPE", "RESTARTS"),
        (
            (
                i.get("instanceId"),
                i.get("functionId"),
                i.get("functionVersionId"),
                i.get("instanceStatus"),
                i.get("instanceState") or i.get("terminationCause"),
                i.get("clusterName") or i.get("clusterId"),
                i.get("instanceType"),
                i.get("restarts"),
            )
            for i in doc.get("instances") or []
        ),
        empty="no instances",
    )
    for name in doc.get("unreachableClusters") or []:
        print(f"nvcf-mono: cluster {name}'s agent did not answer: its instances show no live state", file=ctx.stderr)
    return 0


def _fetch(client: ApiClient, args: argparse.Namespace, tail: int, lines: int | None) -> dict[str, Any]:
    query = {"tail": str(tail)}
    if lines is not None:
        query["lines"] = str(lines)
    if args.log:
        query["log"] = args.log
    doc: dict[str, Any] = client.get(f"/v2/nvcf/instances/{args.instance_id}/logs", query=query)
    return doc


def show_logs(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.json and args.follow:
        raise CliError("--json and --follow do not go together: --json prints one answer")
    tail = min(args.bytes, MAX_TAIL)
    client = connect(args, ctx)
    doc = _fetch(client, args, tail, args.tail)
    if args.json:
        emit_json(ctx, doc)
        return 0
    logs = doc.get("logs") or []
    headers = len(logs) > 1
    escaped = not args.raw and ctx.stdout.isatty()
    for i, log in enumerate(logs):
        if headers:
            print(f"{'' if i == 0 else chr(10)}==> {one_line(str(log.get('name')))} <==", file=ctx.stdout)
        _write(ctx, str(log.get("text") or ""), escaped)
    if args.follow:
        _follow(client, args, ctx, doc, headers=headers, escaped=escaped)
    return 0


def _write(ctx: CliContext, text: str, escaped: bool) -> None:
    ctx.stdout.write(on_terminal(text) if escaped else text)
    ctx.stdout.flush()


def _follow(
    client: ApiClient, args: argparse.Namespace, ctx: CliContext, doc: dict[str, Any], *, headers: bool, escaped: bool
) -> None:
    """Poll the logs and print what each grew by; stops when the instance has ended."""
    sizes = {str(log.get("name")): int(log.get("size") or 0) for log in doc.get("logs") or []}
    last = str((doc.get("logs") or [{}])[-1].get("name")) if doc.get("logs") else None
    state = doc.get("instanceState")
    while state not in _GONE:
        time.sleep(args.interval)
        doc = _fetch(client, args, MAX_TAIL // 16, None)
        state = doc.get("instanceState")
        for log in doc.get("logs") or []:
            name, text, size = str(log.get("name")), str(log.get("text") or ""), int(log.get("size") or 0)
            before = sizes.get(name, 0)
            sizes[name] = size
            if size == before:
                continue
            data = text.encode()
            # A log that shrank was started again: print what it holds now.
            fresh = data if size < before else data[-(size - before) :]
            if headers and name != last:
                print(f"\n==> {one_line(name)} <==", file=ctx.stdout)
                last = name
            _write(ctx, fresh.decode(errors="replace"), escaped)
