"""Cluster ids that stay the same across restarts: configured, or generated once and kept on disk."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import attrs

from nvcf_mono.models.common import new_id
from nvcf_mono.planes.compute.config import ClusterSettings
from nvcf_mono.state_dir import write_private

IDS_FILE = "clusters.json"


@attrs.frozen(kw_only=True)
class ClusterIdentity:
    """Who one agent is."""

    cluster_id: str
    name: str
    group: str
    region: str


def cluster_ids(state_dir: Path, clusters: Sequence[ClusterSettings]) -> dict[str, str]:
    """``name -> id``: the configured id, else the one generated at first start (``clusters.json``)."""
    path = state_dir / IDS_FILE
    try:
        known = json.loads(path.read_text())
        stored = {str(k): str(v) for k, v in known.items()} if isinstance(known, dict) else {}
    except (OSError, ValueError):
        stored = {}
    out: dict[str, str] = {}
    for cluster in clusters:
        out[cluster.name] = cluster.id or stored.get(cluster.name) or new_id()
    merged = {**stored, **{c.name: out[c.name] for c in clusters if c.id is None}}
    if merged != stored:
        write_private(path, (json.dumps(merged, indent=2, sort_keys=True) + "\n").encode())
    return out


def identity(cluster: ClusterSettings, cluster_id: str, default_region: str) -> ClusterIdentity:
    return ClusterIdentity(
        cluster_id=cluster_id,
        name=cluster.name,
        group=cluster.group or cluster.name,
        region=cluster.region or default_region,
    )
