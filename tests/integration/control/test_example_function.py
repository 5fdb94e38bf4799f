"""The example function: registered and deployed once at first start, invocable, never duplicated or revived."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from nvcf_mono.contracts import example
from nvcf_mono.planes.compute.config import BUILTIN_IMAGES
from nvcf_mono.testing.platform import wait_for

from .conftest import Platform, platform

CLUSTER = str(uuid.uuid4())
SETTINGS = {
    "plugins.control.example_function": "true",
    "plugins.compute.clusters": json.dumps(
        [{"name": "local", "id": CLUSTER, "gpu_discovery": "static", "gpus": [{"name": "L40S", "count": 2}]}]
    ),
    "plugins.compute.heartbeat_interval": "0.5",
    # The built-in `echo` image (the test harness points `echo` at the test server otherwise).
    "images.echo.command": json.dumps(list(BUILTIN_IMAGES["echo"].command)),
}


async def examples(p: Platform) -> list[dict]:
    reply = await p.admin.get("/v2/nvcf/functions")
    assert reply.status == 200, reply.body
    return [fn for fn in reply.json["functions"] if fn["name"] == example.NAME]


async def active_example(p: Platform) -> dict:
    async def probe() -> dict | None:
        found = await examples(p)
        return found[0] if found and found[0]["status"] == "ACTIVE" else None

    return await wait_for(probe, timeout=60, what="the example function ACTIVE")


def marker(tmp_path: Path) -> example.Marker | None:
    return example.read_marker(tmp_path / "state" / "plugins" / "control")


@pytest.mark.slow
async def test_the_example_is_deployed_once_and_a_deleted_one_stays_deleted(tmp_path: Path) -> None:
    async with platform(tmp_path, **SETTINGS) as p:
        fn = await active_example(p)
        fid, vid = fn["id"], fn["versionId"]
        assert fn["containerImage"] == "echo" and fn["inferenceUrl"] == "/echo"
        dep = (await p.admin.get(f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}")).json["deployment"]
        (spec,) = dep["deploymentSpecifications"]
        # The smallest instance type of whatever GPU the cluster registered, scaling from zero (max 2).
        assert (spec["gpu"], spec["instanceType"]) == ("L40S", "ON-PREM.GPU.L40S_1x")
        assert (spec["minInstances"], spec["maxInstances"]) == (0, 2)
        assert spec["placement"]["placedInstances"] == 0  # nothing runs until the first call
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "hello", "repeats": 2})
        assert reply.status == 200, reply.body
        assert reply.json["message"] == "hellohello"
        # The example server answers bad input itself; the test server would echo it back.
        bad = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"repeats": "many"})
        assert bad.status == 400 and "'repeats'" in bad.body.decode()
        assert marker(tmp_path) == example.Marker(function_id=fid, version_id=vid, state="deployed")

    # A restart keeps the one example (a call wakes it) and makes no second one.
    async with platform(tmp_path, **SETTINGS) as p:
        again = await active_example(p)
        assert again["id"] == fid
        assert [f["id"] for f in await examples(p)] == [fid]
        assert (await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "back"})).json["message"] == "back"
        assert (await p.admin.delete(f"/v2/nvcf/functions/{fid}/versions/{vid}")).status == 204

    # Deleted, it stays deleted, and the marker says so (the ready banner then names no example).
    async with platform(tmp_path, **SETTINGS) as p:
        assert marker(tmp_path) == example.Marker(function_id=fid, version_id=vid, state="removed")
        clusters = await p.admin.get(f"/v1/accounts/nvcf-default/clusters/{CLUSTER}")
        assert clusters.status == 200  # the cluster registered, so the example would have been made by now
        assert await examples(p) == []


@pytest.mark.slow
async def test_no_example_when_turned_off_and_it_waits_for_a_cluster(tmp_path: Path) -> None:
    async with platform(tmp_path, **{**SETTINGS, "plugins.control.example_function": "false"}) as p:
        await wait_for(lambda: _registered(p), timeout=30, what="the cluster registered")
        assert await examples(p) == [] and marker(tmp_path) is None
    # On, but no cluster (a fresh platform): the example waits (pending) and nothing is registered yet.
    fresh = tmp_path / "fresh"
    async with platform(fresh, **{**SETTINGS, "plugins.compute.clusters": "[]"}) as p:
        pending = marker(fresh)
        assert pending is not None and pending.state == "pending"
        assert await examples(p) == []


async def _registered(p: Platform) -> bool:
    return (await p.admin.get(f"/v1/accounts/nvcf-default/clusters/{CLUSTER}")).status == 200


def test_invoke_lines_read_the_key_from_endpoints_json_and_never_print_it() -> None:
    lines = example.invoke_lines("f1", "http://h:1/", Path(".nvcf-mono"), Path(".nvcf-mono/endpoints.json"))
    assert lines[0].startswith('  key         export NVCF_API_KEY="$(python3 -c ')
    assert lines[0].endswith(' .nvcf-mono/endpoints.json)"')
    assert lines[1:] == [
        '  curl        curl -s http://h:1/v2/nvcf/pexec/functions/f1 -H "Authorization: Bearer $NVCF_API_KEY" '
        "-H 'Content-Type: application/json' -d '{\"message\":\"hello\"}'",
        '  CLI         nvcf-mono invoke f1 -d \'{"message":"hello"}\'',
    ]
    other = example.invoke_lines("f1", "http://h:1", Path("/tmp/s"), Path("/tmp/s/endpoints.json"))
    assert other[0].endswith(' /tmp/s/endpoints.json)"')
    assert other[2].endswith('nvcf-mono invoke f1 --state-dir /tmp/s -d \'{"message":"hello"}\'')
