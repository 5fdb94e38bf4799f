"""``nvcf-mono registry-credential add|list|get|update|delete|list-recognized``: the account's credentials for
private container and Helm registries (NVCF CLI's ``registry-credential``).
"""

from __future__ import annotations

import argparse
import base64
from typing import Any

from nvcf_mono.cli.client import add_api_options, connect, for_account, read_text, upper
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json, fields, table

BASE = "/v2/nvcf/registry-credentials"
TYPES = ("CONTAINER", "HELM", "MODEL", "RESOURCE")


def register(sub: Any) -> None:
    """Add ``registry-credential`` and its subcommands."""
    parser = sub.add_parser(
        "registry-credential",
        help=help_of("registry-credential"),
        description="Credentials the platform uses to pull an account's images (CONTAINER) and charts (HELM) "
        "from private registries, one per registry host name. The secret is never shown again. For NGC "
        "(nvcr.io): --username '$oauthtoken' --password-file <file with the NGC API key>.",
    )
    cmds = parser.add_subparsers(dest="registry_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args, ctx: (parser.print_help(ctx.stdout), 2)[1])

    add = cmds.add_parser("add", help="add a registry's credential")
    add.add_argument("--hostname", required=True, help="the registry's host name, e.g. nvcr.io or ghcr.io")
    add.add_argument("--name", help="the credential's name (default: made from the host name)")
    add.add_argument("--description")
    add.add_argument("--tag", action="append", default=[], dest="tags", help="a tag (repeatable)")
    _secret_options(add)
    _types_option(add, required=True)
    add.set_defaults(func=_add)

    listing = cmds.add_parser("list", help="the account's registry credentials")
    _types_option(listing, required=False, what="only those for these artifact types")
    listing.set_defaults(func=_list)

    get = cmds.add_parser("get", help="one credential")
    get.add_argument("credential_id", metavar="ID")
    get.set_defaults(func=_get)

    update = cmds.add_parser("update", help="replace the secret and/or add artifact types (never removed)")
    update.add_argument("credential_id", metavar="ID")
    update.add_argument("--name", help="the credential's name with a new secret (default: its current one)")
    _secret_options(update, required=False)
    _types_option(update, required=False, what="add these artifact types")
    update.set_defaults(func=_update)

    delete = cmds.add_parser("delete", help="remove one credential")
    delete.add_argument("credential_id", metavar="ID")
    delete.set_defaults(func=_delete)

    recognized = cmds.add_parser("list-recognized", help="the registries recognized by name, per artifact type")
    recognized.set_defaults(func=_recognized)
    add_api_options(recognized)

    for command in (add, listing, get, update, delete):
        command.add_argument("--account", metavar="NCA_ID", help="another account's (super admins)")
        add_api_options(command)


def _secret_options(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    group = parser.add_argument_group("the secret" + ("" if required else " (to replace it)"))
    group.add_argument("--username", help="the registry user (with --password or --password-file)")
    group.add_argument("--password", help="its password (--password-file keeps it out of `ps` and history)")
    group.add_argument("--password-file", metavar="FILE", help="a file holding the password ('-': standard input)")
    group.add_argument("--secret", help="the value as the API takes it: base64 of '<username>:<password>'")


def _types_option(parser: argparse.ArgumentParser, *, required: bool, what: str = "what it is used for") -> None:
    parser.add_argument(
        "--artifact-type",
        action="append",
        type=upper,
        choices=TYPES,
        dest="types",
        required=required,
        default=[],
        help=f"{what}: {', '.join(TYPES)} (repeatable)",
    )


def _prefix(args: argparse.Namespace) -> str:
    return for_account(BASE, args.account)


def _secret_value(args: argparse.Namespace, ctx: CliContext) -> str | None:
    """base64 of ``user:password`` from the flags; None when none was given."""
    if args.secret is not None:
        if args.username is not None or args.password is not None or args.password_file is not None:
            raise CliError("--secret is the whole secret: leave out --username, --password and --password-file")
        return str(args.secret)
    if args.password is not None and args.password_file is not None:
        raise CliError("--password and --password-file: give one")
    if args.username is None:
        if args.password is not None or args.password_file is not None:
            raise CliError("a password needs --username")
        return None
    if args.password_file is not None:
        password = read_text("--password-file", args.password_file, ctx)
    elif args.password is not None:
        password = args.password
    else:
        raise CliError("--username needs --password or --password-file")
    return base64.b64encode(f"{args.username}:{password}".encode()).decode()


def _default_name(hostname: str) -> str:
    kept = "".join(c if (c.isascii() and c.isalnum()) or c in "_.-" else "-" for c in hostname.strip().lower())
    return kept.strip("-._") or "registry"


def _add(args: argparse.Namespace, ctx: CliContext) -> int:
    value = _secret_value(args, ctx)
    if value is None:
        raise CliError("add needs the secret: --username with --password or --password-file, or --secret")
    body: dict[str, Any] = {
        "registryHostname": args.hostname,
        "secret": {"name": args.name or _default_name(args.hostname), "value": value},
        "artifactTypes": list(dict.fromkeys(args.types)),
    }
    if args.tags:
        body["tags"] = args.tags
    if args.description is not None:
        body["description"] = args.description
    doc = connect(args, ctx).post(_prefix(args), body)
    _show(args, ctx, doc)
    return 0


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    doc = connect(args, ctx).get(_prefix(args), management=True)
    if args.types:  # any of them (the API's artifactType filter, for several at once)
        wanted = set(args.types)
        kept = [c for c in doc.get("registryCredentials") or [] if wanted & set(c.get("artifactTypes") or ())]
        doc = {**doc, "registryCredentials": kept}
    if args.json:
        emit_json(ctx, doc)
        return 0
    table(
        ctx,
        ("ID", "HOSTNAME", "ARTIFACT TYPES", "NAME", "BY", "UPDATED"),
        (
            (
                c.get("registryCredentialId"),
                c.get("registryHostname"),
                c.get("artifactTypes"),
                c.get("registryCredentialName"),
                c.get("provisionedBy"),
                c.get("lastUpdatedAt"),
            )
            for c in doc.get("registryCredentials") or []
        ),
        empty="no registry credentials",
    )
    return 0


def _get(args: argparse.Namespace, ctx: CliContext) -> int:
    _show(args, ctx, connect(args, ctx).get(f"{_prefix(args)}/{args.credential_id}", management=True))
    return 0


def _update(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    body: dict[str, Any] = {}
    value = _secret_value(args, ctx)
    if value is not None:
        name = args.name
        if name is None:
            current = client.get(f"{_prefix(args)}/{args.credential_id}", management=True)
            name = current["registryCredential"]["registryCredentialName"]
        body["secret"] = {"name": name, "value": value}
    elif args.name is not None:
        raise CliError("--name goes with a new secret")
    if args.types:
        body["artifactTypeEnums"] = list(dict.fromkeys(args.types))
    if not body:
        raise CliError("nothing to update: give a new secret or --artifact-type")
    _show(args, ctx, client.patch(f"{_prefix(args)}/{args.credential_id}", body))
    return 0


def _delete(args: argparse.Namespace, ctx: CliContext) -> int:
    connect(args, ctx).delete(f"{_prefix(args)}/{args.credential_id}")
    if not args.json:
        print(f"deleted {args.credential_id}", file=ctx.stdout)
    return 0


def _recognized(args: argparse.Namespace, ctx: CliContext) -> int:
    doc = connect(args, ctx).get("/v2/nvcf/recognized-registries", management=True)
    if args.json:
        emit_json(ctx, doc)
        return 0
    rows = [
        (kind, r.get("name"), r.get("hostname"))
        for kind, registries in (doc.get("recognizedRegistries") or {}).items()
        for r in registries
    ]
    table(ctx, ("ARTIFACT TYPE", "REGISTRY", "HOSTNAME"), rows, empty="no recognized registries")
    return 0


def _show(args: argparse.Namespace, ctx: CliContext, doc: dict[str, Any]) -> None:
    if args.json:
        emit_json(ctx, doc)
        return
    c = doc.get("registryCredential") or {}
    fields(
        ctx,
        (
            ("id", c.get("registryCredentialId")),
            ("hostname", c.get("registryHostname")),
            ("registry", c.get("registryName")),
            ("name", c.get("registryCredentialName")),
            ("artifact types", c.get("artifactTypes")),
            ("provisioned by", c.get("provisionedBy")),
            ("tags", c.get("tags")),
            ("description", c.get("description")),
            ("created", c.get("createdAt")),
            ("updated", c.get("lastUpdatedAt")),
        ),
    )
