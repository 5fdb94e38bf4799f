"""``nvcf-mono cluster list|status|groups``: the clusters that run functions, their live status, their groups."""

from __future__ import annotations

import argparse
from typing import Any

from nvcf_mono.cli.client import add_api_options, connect
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json, fields, table

DEFAULT_ACCOUNT = "nvcf-default"


def register(sub: Any) -> None:
    """Add ``cluster`` and its subcommands."""
    cluster = sub.add_parser("cluster", help=help_of("cluster"))
    cmds = cluster.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    cluster.set_defaults(func=lambda args, ctx: (cluster.print_help(ctx.stdout), 2)[1])

    listing = cmds.add_parser("list", help="list the account's clusters, their health and GPUs")
    listing.add_argument("--account", default=DEFAULT_ACCOUNT, metavar="NCA_ID", help=f"default {DEFAULT_ACCOUNT}")
    add_api_options(listing)
    listing.set_defaults(func=_list)

    status = cmds.add_parser("status", help="show a cluster as its agent sees it now: GPUs used and free, instances")
    status.add_argument("cluster", metavar="NAME_OR_ID", help="the cluster's name or id (see `cluster list`)")
    status.add_argument("--account", default=DEFAULT_ACCOUNT, metavar="NCA_ID", help=f"default {DEFAULT_ACCOUNT}")
    add_api_options(status)
    status.set_defaults(func=_status)

    groups = cmds.add_parser("groups", help="list cluster groups (a group's name is a deployment's backend)")
    add_api_options(groups)
    groups.set_defaults(func=_groups)


def _usage(cluster: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``gpuUsage`` by GPU name, whether the API sends a map or a list."""
    usage = cluster.get("gpuUsage")
    if isinstance(usage, dict):
        return {str(k): v for k, v in usage.items() if isinstance(v, dict)}
    if isinstance(usage, list):
        return {str(u.get("name") or u.get("gpu")): u for u in usage if isinstance(u, dict)}
    return {}


def _gpus(cluster: dict[str, Any]) -> str:
    usage = _usage(cluster)
    out = []
    for gpu in cluster.get("gpus") or []:
        name = gpu.get("name")
        used = usage.get(str(name))
        if used is not None and used.get("available") is not None:
            out.append(f"{name} {used['available']}/{used.get('capacity', gpu.get('capacity'))} free")
        else:
            out.append(f"{name} x{gpu.get('capacity')}")
    return ", ".join(out)


#: How a maintenance mode reads beside a cluster's health.
_MAINTENANCE = {"CordonOnly": "cordoned", "CordonAndDrain": "cordoned, draining"}


def _health(cluster: dict[str, Any]) -> str:
    """``healthy``, or ``healthy (cordoned)`` for a cluster that takes no new instances."""
    status = str(cluster.get("status") or "")
    mode = _MAINTENANCE.get(str(cluster.get("maintenanceMode")))
    return f"{status} ({mode})" if mode else status


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    doc = client.get(f"/v1/accounts/{args.account}/clusters", management=True)
    if args.json:
        emit_json(ctx, doc)
        return 0
    clusters = doc.get("clusters") if isinstance(doc, dict) else doc
    table(
        ctx,
        ("NAME", "CLUSTER ID", "GROUP", "REGION", "STATUS", "GPUS"),
        (
            (
                c.get("clusterName"),
                c.get("clusterId"),
                c.get("clusterGroupName"),
                c.get("region"),
                _health(c),
                _gpus(c),
            )
            for c in clusters or []
        ),
        empty=f"no clusters in account {args.account}",
    )
    return 0


def _status(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    doc = client.get(f"/v1/accounts/{args.account}/clusters", management=True)
    clusters = (doc.get("clusters") if isinstance(doc, dict) else doc) or []
    wanted = args.cluster
    found = [c for c in clusters if wanted == c.get("clusterId")] or [
        c for c in clusters if wanted.lower() == str(c.get("clusterName", "")).lower()
    ]
    if not found:
        raise CliError(
            f"no cluster named {wanted!r} (or with that id) in account {args.account}; see `cluster list`", 1
        )
    if len(found) > 1:
        ids = ", ".join(str(c.get("clusterId")) for c in found)
        raise CliError(f"{len(found)} clusters are named {wanted!r} ({ids}): name one by its id", 1)
    status = client.get(f"/v1/accounts/{args.account}/clusters/{found[0]['clusterId']}/status", management=True)
    if args.json:
        emit_json(ctx, status)
        return 0
    gpus = [
        f"{g.get('name')} {g.get('allocated')}/{g.get('capacity')} used, {g.get('available')} free"
        for g in status.get("gpus") or []
    ]
    fields(
        ctx,
        (
            ("name", status.get("clusterName")),
            ("cluster id", status.get("clusterId")),
            ("group", status.get("clusterGroupName")),
            ("region", status.get("region")),
            ("status", _health(status)),
            ("backend", status.get("backend")),
            ("gpus", gpus),
            ("instances", status.get("instanceCount")),
            ("last heartbeat", status.get("lastHeartbeatAt")),
        ),
    )
    print(file=ctx.stdout)
    table(
        ctx,
        ("INSTANCE ID", "FUNCTION ID", "VERSION ID", "STATE", "STATUS", "GPUS", "RESTARTS", "CREATED"),
        (
            (
                i.get("instanceId"),
                i.get("functionId"),
                i.get("functionVersionId"),
                i.get("instanceState"),
                i.get("status"),
                [str(d) for d in i.get("devices") or []],
                i.get("restarts"),
                i.get("createdAt"),
            )
            for i in status.get("instances") or []
        ),
        empty="no instances",
    )
    return 0


def _groups(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    doc = client.get("/v2/nvcf/clusterGroups", management=True)
    if args.json:
        emit_json(ctx, doc)
        return 0
    rows = []
    for group in doc.get("clusterGroups") or []:
        types = [t.get("name") for g in group.get("gpus") or [] for t in g.get("instanceTypes") or []]
        rows.append(
            (
                group.get("name"),
                group.get("id"),
                [c.get("name") for c in group.get("clusters") or []],
                [g.get("name") for g in group.get("gpus") or []],
                types,
            )
        )
    table(ctx, ("NAME", "ID", "CLUSTERS", "GPUS", "INSTANCE TYPES"), rows, empty="no cluster groups")
    return 0
