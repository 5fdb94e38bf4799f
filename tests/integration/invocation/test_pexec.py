from __future__ import annotations

import json
from pathlib import Path

import pytest

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
