from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvcf_mono.contracts import subjects

from .conftest import deployed, launching_agent, platform


@pytest.mark.slow
async def test_pexec_passes_status_headers_and_body_through(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin)
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "hi", "repeats": 2})
        assert reply.status == 200, reply.body
        assert reply.json["message"] == "hihi"
        assert reply.headers["NVCF-STATUS"] == "fulfilled"
        assert reply.json["reqid"] == reply.headers["NVCF-REQID"]
        raw = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}/versions/{vid}",
            data=b"\x00raw bytes",
            headers={"Content-Type": "application/x-thing"},
        )
        assert raw.status == 200 and raw.body == b"\x00raw bytes"
        assert raw.headers["Content-Type"].startswith("application/x-thing")
        assert "Authorization" not in json.dumps(dict(raw.headers))


@pytest.mark.slow
async def test_a_request_id_is_remembered_while_its_store_may_be_retried(tmp_path: Path) -> None:
    """The queue's duplicate window lasts as long as a store is retried (twice publish_patience), not the
    bus's default: nats-server keeps every id of the window in memory, so a longer window only costs.
    """
    async with (
        platform(tmp_path, **{"plugins.invocation.publish_patience": 4}) as p,
        launching_agent(p, tmp_path / "instances"),
    ):
        fid, vid = await deployed(p.admin)
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}/versions/{vid}", {"message": "hi"})
        assert reply.status == 200, reply.body
        region = p.host.settings.node.region
        name = subjects.request_stream(region, vid)
        info = await p.bus.client.jetstream().stream_info(name)
        assert info.config.duplicate_window == 8.0
        # A store retried after the answered request left the queue: a duplicate, not a second request.
        rid = reply.headers["NVCF-REQID"]
        ack = await p.bus.stream(name).publish(subjects.request_subject(region, vid, rid), b"again", msg_id=rid)
        assert ack.duplicate
        assert (await p.bus.stream(name).info()).messages == 0
