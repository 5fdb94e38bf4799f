"""``nvcf-mono telemetry add|list|get|delete|set-secret``: the account's telemetry endpoints, which function
versions and tasks pick with ``--{logs,metrics,traces}-telemetry-id``.
"""

from __future__ import annotations

import argparse
from typing import Any

from nvcf_mono.cli.client import add_api_options, connect, for_account, read_text, upper
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json, fields, table

BASE = "/v2/nvcf/telemetries"
TYPES = ("LOGS", "METRICS", "TRACES")
PROVIDERS = ("OTEL_COLLECTOR", "GRAFANA_CLOUD")


def register(sub: Any) -> None:
    """Add ``telemetry`` and its subcommands."""
    parser = sub.add_parser(
        "telemetry",
        help=help_of("telemetry"),
        description="Where an account's functions and tasks send their traces, metrics and logs (OTLP/HTTP to "
        "<endpoint>/v1/traces, /v1/metrics and /v1/logs). A function version or task picks one per kind: "
        "nvcf-mono function create ... --traces-telemetry-id ID. The secret is never shown again.",
    )
    cmds = parser.add_subparsers(dest="telemetry_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args, ctx: (parser.print_help(ctx.stdout), 2)[1])

    add = cmds.add_parser("add", help="add an endpoint")
    add.add_argument("--name", required=True, help="its name (unique in the account; the secret's name)")
    add.add_argument(
        "--endpoint", required=True, help="the OTLP/HTTP receiver's base URL, e.g. https://otel.example.com:4318"
    )
    add.add_argument("--provider", type=upper, choices=PROVIDERS, default="OTEL_COLLECTOR", help="default: %(default)s")
    add.add_argument("--protocol", type=upper, choices=("HTTP", "GRPC"), default="HTTP", help="default: %(default)s")
    add.add_argument(
        "--type",
        action="append",
        type=upper,
        choices=TYPES,
        dest="types",
        default=[],
        help="what it takes: LOGS, METRICS, TRACES (repeatable; default: all three)",
    )
    _secret_options(add)
    add.set_defaults(func=_add)

    listing = cmds.add_parser("list", help="the account's endpoints")
    listing.set_defaults(func=_list)
    get = cmds.add_parser("get", help="one endpoint")
    get.add_argument("telemetry_id", metavar="ID")
    get.set_defaults(func=_get)
    delete = cmds.add_parser("delete", help="remove an endpoint no version or unfinished task uses")
    delete.add_argument("telemetry_id", metavar="ID")
    delete.set_defaults(func=_delete)
    secret = cmds.add_parser("set-secret", help="replace an endpoint's secret (instances started from then on)")
    secret.add_argument("telemetry_id", metavar="ID")
    _secret_options(secret)
    secret.set_defaults(func=_set_secret)

    for command in (add, listing, get, delete, secret):
        command.add_argument("--account", metavar="NCA_ID", help="another account's (super admins)")
        add_api_options(command)


def _secret_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the secret")
    group.add_argument("--secret", help="OTEL_COLLECTOR: the bearer token it expects; GRAFANA_CLOUD: the API key")
    group.add_argument("--secret-file", metavar="FILE", help="the same from a file ('-': standard input)")
    group.add_argument("--instance-id", help="GRAFANA_CLOUD: the stack's instance id (sent with the API key)")


def _prefix(args: argparse.Namespace) -> str:
    return for_account(BASE, args.account)


def _secret(args: argparse.Namespace, ctx: CliContext, name: str) -> dict[str, Any]:
    if (args.secret is None) == (args.secret_file is None):
        raise CliError("the secret: give --secret or --secret-file")
    token = read_text("--secret-file", args.secret_file, ctx).strip() if args.secret_file else args.secret
    value: Any = token if args.instance_id is None else {"instanceId": args.instance_id, "apiKey": token}
    return {"name": name, "value": value}


def _add(args: argparse.Namespace, ctx: CliContext) -> int:
    if (args.provider == "GRAFANA_CLOUD") != (args.instance_id is not None):
        raise CliError("--instance-id goes with --provider GRAFANA_CLOUD, and it needs one")
    body = {
        "endpoint": args.endpoint,
        "protocol": args.protocol,
        "provider": args.provider,
        "types": list(dict.fromkeys(args.types)) or list(TYPES),
        "secret": _secret(args, ctx, args.name),
    }
    _show(args, ctx, connect(args, ctx).post(_prefix(args), body))
    return 0


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    doc = connect(args, ctx).get(_prefix(args), management=True)
    if args.json:
        emit_json(ctx, doc)
        return 0
    table(
        ctx,
        ("ID", "NAME", "PROVIDER", "TYPES", "ENDPOINT"),
        (
            (t.get("telemetryId"), t.get("name"), t.get("provider"), t.get("types"), t.get("endpoint"))
            for t in doc.get("telemetries") or []
        ),
        empty="no telemetry endpoints",
    )
    return 0


def _get(args: argparse.Namespace, ctx: CliContext) -> int:
    _show(args, ctx, connect(args, ctx).get(f"{_prefix(args)}/{args.telemetry_id}", management=True))
    return 0


def _delete(args: argparse.Namespace, ctx: CliContext) -> int:
    connect(args, ctx).delete(f"{_prefix(args)}/{args.telemetry_id}")
    if not args.json:
        print(f"deleted {args.telemetry_id}", file=ctx.stdout)
    return 0


def _set_secret(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    current = client.get(f"{_prefix(args)}/{args.telemetry_id}", management=True)["telemetry"]
    secret = {"secret": _secret(args, ctx, current["name"])}
    client.put(for_account(f"/v2/nvcf/secrets/telemetries/{args.telemetry_id}", args.account), secret)
    if not args.json:
        print(f"replaced the secret of {current['name']} ({args.telemetry_id})", file=ctx.stdout)
    return 0


def _show(args: argparse.Namespace, ctx: CliContext, doc: dict[str, Any]) -> None:
    if args.json:
        emit_json(ctx, doc)
        return
    t = doc.get("telemetry") or {}
    fields(
        ctx,
        (
            ("id", t.get("telemetryId")),
            ("name", t.get("name")),
            ("endpoint", t.get("endpoint")),
            ("provider", t.get("provider")),
            ("protocol", t.get("protocol")),
            ("types", t.get("types")),
            ("created", t.get("createdAt")),
        ),
    )
