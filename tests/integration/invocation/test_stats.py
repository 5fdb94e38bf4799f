"""``GET /v2/nvcf/stats``: the last hour of the caller's invocations, from every node's load reports.

Real instances (the echo server and ``nvcf-mono worker``) serve the calls; the counts reach the
control plane in the invocation node's load reports, as they would from any node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvcf_mono.testing.platform import wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION, deployed, launching_agent, other_account_key, platform

pytestmark = pytest.mark.slow


async def test_stats_count_the_callers_invocations_errors_and_latency(tmp_path: Path) -> None:
    settings = {"plugins.invocation.load_report_interval": 0.2}
    async with platform(tmp_path, **settings) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin, ECHO_FUNCTION)
        url = f"/v2/nvcf/pexec/functions/{fid}"
        for _ in range(5):
            assert (await p.key.post(url, {"message": "m", "delay": 0.05})).status == 200
        assert (await p.key.post(url, {"message": "m"}, headers={"NVCF-POLL-SECONDS": "x"})).status == 400

        async def counted() -> dict[str, Any] | None:
            reply = await p.key.get("/v2/nvcf/stats", params={"minutes": "5"})
            assert reply.status == 200, reply.body
            doc: dict[str, Any] = reply.json
            answered = sum(point["invocations"] for point in doc["total"])
            return doc if answered >= 5 and sum(point["errors"] for point in doc["total"]) >= 1 else None

        doc = await wait_for(counted, timeout=15, what="the invocations in the stats")
        assert doc["stepSeconds"] == 60 and len(doc["total"]) == 5
        (version,) = doc["versions"]
        assert (version["functionId"], version["functionVersionId"], version["functionName"]) == (fid, vid, "echo")
        busy = [point for point in version["points"] if point["invocations"]]
        assert sum(point["invocations"] for point in busy) == 5  # the 400 was refused before it was queued
        # A request queued just before a minute ends is answered in the next: its latency counts there.
        timed = [point for point in version["points"] if point.get("p50Ms") is not None]
        assert timed and all(25 <= point["p95Ms"] <= 1000 for point in timed), version["points"]

        one = await p.key.get("/v2/nvcf/stats", params={"functionId": fid, "versionId": vid, "minutes": "1"})
        assert one.status == 200 and len(one.json["versions"]) == 1 and len(one.json["total"]) == 1

        # Another account sees none of it, and cannot name the function.
        other = p.api(await other_account_key(p, "other-account"))
        theirs = await other.get("/v2/nvcf/stats")
        assert theirs.status == 200 and theirs.json["versions"] == []
        assert all(point["invocations"] == 0 for point in theirs.json["total"])
        assert (await other.get("/v2/nvcf/stats", params={"functionId": fid})).status == 404
        assert (await p.key.get("/v2/nvcf/stats", params={"versionId": vid})).status == 400
        assert (await p.key.get("/v2/nvcf/stats", params={"minutes": "61"})).status == 400
