"""``nvcf-mono cluster list|groups``: the clusters that run functions, and their cluster groups."""

from __future__ import annotations

import argparse
from typing import Any

from nvcf_mono.cli.client import add_api_options, connect
from nvcf_mono.cli.context import CliContext
from nvcf_mono.cli.output import emit_json, table

DEFAULT_ACCOUNT = "nvcf-default"


def register(sub: Any) -> None:
    """Add ``cluster`` and its subcommands."""
    cluster = sub.add_parser("cluster", help="list clusters and cluster groups")
    cmds = cluster.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    cluster.set_defaults(func=lambda args, ctx: (cluster.print_help(ctx.stdout), 2)[1])

    listing = cmds.add_parser("list", help="list the account's clusters, their health and GPUs")
    listing.add_argument("--account", default=DEFAULT_ACCOUNT, metavar="NCA_ID", help=f"default {DEFAULT_ACCOUNT}")
    add_api_options(listing)
    listing.set_defaults(func=_list)

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
                c.get("status"),
                _gpus(c),
            )
            for c in clusters or []
        ),
        empty=f"no clusters in account {args.account}",
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
