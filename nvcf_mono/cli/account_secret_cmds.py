"""``nvcf-mono account-secret set|list|delete``: the account's own secrets, read by all its instances and tasks."""

from __future__ import annotations

import argparse
from typing import Any

from nvcf_mono.cli.client import add_api_options, connect, for_account, key_value, read_input
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json

OWN = "/v2/nvcf/secrets/account"


def register(sub: Any) -> None:
    """Add ``account-secret`` and its subcommands."""
    parser = sub.add_parser(
        "account-secret",
        help=help_of("account-secret"),
        description="An account's secrets reach every instance and task of the account, in the same SECRETS_FILE "
        "as the function's (or task's) own secrets, which win where a name is in both. Values are never shown.",
    )
    cmds = parser.add_subparsers(dest="account_secret_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args, ctx: (parser.print_help(ctx.stdout), 2)[1])

    put = cmds.add_parser("set", help="add or replace secrets (merged over the others)")
    put.add_argument(
        "pairs",
        nargs="+",
        metavar="NAME=VALUE",
        help="a value of @PATH is read from that file, @- from standard input (keeps it out of the shell's "
        "history and `ps`)",
    )
    listing = cmds.add_parser("list", help="the names of the account's secrets")
    delete = cmds.add_parser("delete", help="remove one secret")
    delete.add_argument("name", metavar="NAME")
    for command, func in ((put, _set), (listing, _list), (delete, _delete)):
        command.add_argument("--account", metavar="NCA_ID", help="another account's (super admins)")
        add_api_options(command)
        command.set_defaults(func=func)


def _path(args: argparse.Namespace) -> str:
    return for_account(OWN, args.account)


def _value(name: str, raw: str, ctx: CliContext) -> str:
    if not raw.startswith("@"):
        return raw
    data = read_input(f"secret {name!r}: cannot read", raw[1:], ctx)
    try:
        return data.decode().removesuffix("\n")
    except UnicodeDecodeError:
        raise CliError(f"secret {name!r}: {raw[1:]} is not UTF-8 text") from None


def _set(args: argparse.Namespace, ctx: CliContext) -> int:
    pairs = [key_value("NAME=VALUE", item) for item in args.pairs]
    secrets = [{"name": name, "value": _value(name, raw, ctx)} for name, raw in pairs]
    connect(args, ctx).put(_path(args), {"secrets": secrets})
    if not args.json:
        print(f"set {', '.join(name for name, _ in pairs)}", file=ctx.stdout)
    return 0


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    doc = connect(args, ctx).get(_path(args), management=True)
    if args.json:
        emit_json(ctx, doc)
    else:
        print("\n".join(doc.get("secrets") or []) or "no account secrets", file=ctx.stdout)
    return 0


def _delete(args: argparse.Namespace, ctx: CliContext) -> int:
    connect(args, ctx).delete(f"{_path(args)}/{args.name}")
    if not args.json:
        print(f"deleted {args.name}", file=ctx.stdout)
    return 0
