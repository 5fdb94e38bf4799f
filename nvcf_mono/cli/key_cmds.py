"""``nvcf-mono api-key generate|list|revoke|delegate``: API keys for invoking functions or running tasks,
and delegation tokens for handing a client a few functions for a while.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import Any

from nvcf_mono.auth import scopes as S
from nvcf_mono.cli.client import add_api_options, connect, csv_list
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json, fields, table
from nvcf_mono.models.api_key import FUNCTIONS_SERVICE_ID, TASKS_SERVICE_ID, Product, key_policy_document
from nvcf_mono.models.common import iso, utc_now

KEYS = "/v1/keys"
# What NVCF's CLI gives each kind of key (reference control-plane §5).
DEFAULTS: dict[str, tuple[Product, tuple[str, ...], tuple[str, ...], str, str, str]] = {
    "function": (
        Product.FUNCTIONS,
        (S.INVOKE_FUNCTION, S.LIST_FUNCTIONS, S.QUEUE_DETAILS, S.LIST_FUNCTIONS_DETAILS),
        ("account-functions:*", "authorized-functions:*"),
        "nvcf-api",
        FUNCTIONS_SERVICE_ID,
        "NVCF_API_KEY",
    ),
    "task": (
        Product.TASKS,
        (
            S.LAUNCH_TASK,
            S.LIST_TASKS,
            S.TASK_DETAILS,
            S.CANCEL_TASK,
            S.DELETE_TASK,
            S.LIST_EVENTS,
            S.LIST_RESULTS,
            S.UPDATE_SECRETS,
        ),
        ("account-tasks:*",),
        "nvct-api",
        TASKS_SERVICE_ID,
        "NVCF_NVCT_API_KEY",
    ),
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_RX = re.compile(r"(?:\d+[smhdw])+")


def parse_duration(text: str) -> timedelta:
    """``24h``, ``7d``, ``1h30m`` -> a timedelta (an argparse type)."""
    cleaned = text.strip().lower()
    if not _DURATION_RX.fullmatch(cleaned):
        raise argparse.ArgumentTypeError(f"expected a duration such as 24h, 7d or 1h30m, got {text!r}")
    seconds = sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)([smhdw])", cleaned))
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0, got {text!r}")
    return timedelta(seconds=seconds)


def register(sub: Any) -> None:
    """Add ``api-key`` and its subcommands."""
    keys = sub.add_parser("api-key", help=help_of("api-key"))
    cmds = keys.add_subparsers(dest="key_command", metavar="SUBCOMMAND")
    keys.set_defaults(func=lambda args, ctx: (keys.print_help(ctx.stdout), 2)[1])

    generate = cmds.add_parser(
        "generate",
        help="create an API key (its value is shown once)",
        description="Create an API key. A function key defaults to the scopes invoke_function, list_functions, "
        "queue_details and list_functions_details on account-functions:* and authorized-functions:*; a task key "
        "to the eight task scopes on account-tasks:*.",
    )
    generate.add_argument("--for", dest="kind", choices=tuple(DEFAULTS), default="function", help="default function")
    generate.add_argument("--scopes", type=csv_list, metavar="A,B", help="scopes (default: the kind's)")
    generate.add_argument(
        "--resources",
        type=csv_list,
        metavar="TYPE:ID,...",
        help="e.g. account-functions:*,function:<fid>/<vid> (default: the kind's)",
    )
    generate.add_argument(
        "--expires-in", type=parse_duration, default=timedelta(hours=24), metavar="DURATION", help="default 24h"
    )
    generate.add_argument("--description", help="letters, digits, spaces, '-' and '_' (1-64)")
    add_api_options(generate)
    generate.set_defaults(func=_generate)

    listing = cmds.add_parser("list", help="list your API keys")
    add_api_options(listing)
    listing.set_defaults(func=_list)

    revoke = cmds.add_parser("revoke", help="revoke an API key", description="Prints nothing with --json.")
    revoke.add_argument("key_id", metavar="ID")
    add_api_options(revoke)
    revoke.set_defaults(func=_revoke)

    delegate = cmds.add_parser(
        "delegate",
        help="mint a delegation token: a client may invoke up to 4 functions for a while",
        description="Mint a delegation token (POST /v2/nvcf/tokens/functions): a bearer that holds invoke_function "
        "on the named functions (FUNCTION_ID, or FUNCTION_ID:VERSION_ID for one version) only. The function sees "
        "the client id as its caller. It expires after the platform's delegation lifetime (an hour by default), "
        "and with the API key that minted it.",
    )
    delegate.add_argument("functions", nargs="+", metavar="FUNCTION[:VERSION]")
    delegate.add_argument("--client-id", required=True, help="who the token is for (1-128 printable characters)")
    add_api_options(delegate)
    delegate.set_defaults(func=_delegate)


def _resource(item: str) -> dict[str, str]:
    kind, sep, ident = item.partition(":")
    if not sep or not kind or not ident:
        raise CliError(f"--resources {item!r}: expected TYPE:ID, e.g. account-functions:* or function:<fid>/<vid>")
    return {"id": ident, "type": kind}


def _generate(args: argparse.Namespace, ctx: CliContext) -> int:
    product, scopes, resources, issuer, issuer_id, env_name = DEFAULTS[args.kind]
    wanted_scopes = tuple(args.scopes) if args.scopes is not None else scopes
    if not wanted_scopes:
        raise CliError("--scopes: give at least one scope")
    wanted = [_resource(r) for r in (args.resources if args.resources is not None else resources)]
    body = {
        "description": args.description or f"nvcf-mono CLI {args.kind} key",
        "expires_at": iso(utc_now() + args.expires_in),
        "authorizations": key_policy_document(wanted_scopes, wanted, product),
    }
    client = connect(args, ctx)
    doc = client.post(KEYS, body, headers={"Key-Issuer-Service": issuer, "Key-Issuer-Id": issuer_id})
    if args.json:
        emit_json(ctx, doc)
    else:
        fields(
            ctx,
            [
                ("id", doc.get("id")),
                ("description", doc.get("description")),
                ("status", doc.get("status")),
                ("expires", doc.get("expires_at")),
                ("scopes", list(wanted_scopes)),
                ("resources", [f"{r['type']}:{r['id']}" for r in wanted]),
                ("key", doc.get("value")),
            ],
        )
    print(
        f"Save the key now: it is not shown again. Use it with: export {env_name}=<key>",
        file=ctx.stderr,
    )
    return 0


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    doc = client.get(KEYS, management=True)
    if args.json:
        emit_json(ctx, doc)
        return 0
    table(
        ctx,
        ("ID", "DESCRIPTION", "STATUS", "KEY", "CREATED", "EXPIRES"),
        (
            (
                k.get("id"),
                k.get("description"),
                k.get("status"),
                k.get("masked_key"),
                k.get("created_at"),
                k.get("expires_at"),
            )
            for k in doc.get("keys") or []
        ),
        empty="no API keys",
    )
    return 0


def _revoke(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    client.delete(f"{KEYS}/{args.key_id}")
    if not args.json:
        print(f"revoked API key {args.key_id}", file=ctx.stdout)
    return 0


def _delegate(args: argparse.Namespace, ctx: CliContext) -> int:
    if len(args.functions) > 4:
        raise CliError(f"a delegation token names at most 4 functions, got {len(args.functions)}")
    wanted = []
    for item in args.functions:
        fid, _, vid = item.partition(":")
        wanted.append({"functionId": fid, **({"functionVersionId": vid} if vid else {})})
    client = connect(args, ctx)
    doc = client.post("/v2/nvcf/tokens/functions", {"functions": wanted, "clientId": args.client_id})
    if args.json:
        emit_json(ctx, doc)
        return 0
    fields(ctx, [("expires in", f"{doc.get('expires_in')}s"), ("token", doc.get("access_token"))])
    return 0
