"""Instances, their logs and a cluster's live status over HTTP, answered by the real agent with the local backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvcf_mono.contracts import subjects
from nvcf_mono.testing.platform import Api, wait_for, wait_status

from .conftest import (
    CLUSTER_A,
    all_gone,
    cluster_pids,
    compute_platform,
    create,
    deploy,
    function,
    instances,
    pids,
    running,
    spec,
)

CLUSTERS = "/v1/accounts/nvcf-default/clusters"
#: The echo example, after three lines on stdout (so its log has known content).
CHATTY_SCRIPT = (
    "import runpy, sys; print('chatty-1'); print('chatty-2'); print('chatty-3', flush=True); "
    "sys.argv = ['echo', '--port', '{port}']; runpy.run_module('nvcf_mono.examples.echo', run_name='__main__')"
)
CHATTY = ["{python}", "-c", CHATTY_SCRIPT]
IMAGES = {
    "images.chatty.command": json.dumps(CHATTY),
    "images.broken.command": json.dumps(["/nonexistent/bin/server", "--port", "{port}"]),
}


async def logs_of(api: Api, instance_id: str, **query: Any) -> dict[str, Any]:
    reply = await api.get(f"/v2/nvcf/instances/{instance_id}/logs", params={k: str(v) for k, v in query.items()})
    assert reply.status == 200, reply.body
    doc: dict[str, Any] = reply.json
    return doc


def log_text(doc: dict[str, Any], name: str) -> str:
    return str(next(log for log in doc["logs"] if log["name"] == name)["text"])


@pytest.mark.slow
async def test_instances_logs_and_cluster_status_of_a_running_function(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, None, **IMAGES) as p:
        fid, vid, d = await create(p.admin, function("chatty", containerImage="chatty"))
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        iid = view.instance.instance_id

        # The function key (list_functions_details) sees its account's instances with the agent's live view.
        listed = await p.key.get("/v2/nvcf/instances")
        assert listed.status == 200, listed.body
        (inst,) = listed.json["instances"]
        assert inst["instanceId"] == iid and inst["icmsRequestId"] == view.request_id
        assert (inst["functionId"], inst["functionVersionId"], inst["ncaId"]) == (fid, vid, "nvcf-default")
        assert (inst["clusterId"], inst["clusterName"], inst["backend"]) == (CLUSTER_A, "local", "local")
        assert (inst["instanceStatus"], inst["instanceState"], inst["status"]) == ("ACTIVE", "running", "fulfilled")
        assert inst["instanceType"] == "ON-PREM.GPU.H100_1x" and inst["gpu"] == "H100"
        # What the agent says (0 unless the machine was so loaded that a readiness probe timed out).
        assert inst["restarts"] == view.instance.restarts and inst["devices"] == [0] and inst["readyAt"]
        assert "unreachableClusters" not in listed.json

        for query in ({"functionId": fid}, {"functionId": fid, "functionVersionId": vid}, {"cluster": "local"}):
            again = await p.key.get("/v2/nvcf/instances", params=query)
            assert [i["instanceId"] for i in again.json["instances"]] == [iid], query
        by_version = await p.key.get(f"/v2/nvcf/functions/{fid}/versions/{vid}/instances")
        assert by_version.status == 200 and [i["instanceId"] for i in by_version.json["instances"]] == [iid]
        assert (await p.key.get("/v2/nvcf/instances", params={"cluster": CLUSTER_A})).json["instances"]

        missing = await p.key.get("/v2/nvcf/instances", params={"functionId": "no-such-function"})
        assert missing.status == 404 and "no-such-function" in missing.detail
        lone = await p.key.get("/v2/nvcf/instances", params={"functionVersionId": vid})
        assert lone.status == 400 and "functionId" in lone.detail
        nowhere = await p.key.get("/v2/nvcf/instances", params={"cluster": "atlantis"})
        assert nowhere.status == 404 and "atlantis" in nowhere.detail
        other = await p.key.get(f"/v2/nvcf/functions/{fid}/versions/{fid}/instances")
        assert other.status == 404

        # Logs: both by default, the server's stdout in 'inference'.
        async def chatty() -> dict[str, Any] | None:
            doc = await logs_of(p.key, iid)
            return doc if "chatty-3" in log_text(doc, "inference") else None

        doc = await wait_for(chatty, timeout=10, what="the server's output in its log")
        assert (doc["instanceId"], doc["functionId"], doc["clusterId"]) == (iid, fid, CLUSTER_A)
        assert doc["instanceState"] == "running" and doc["clusterName"] == "local"
        assert sorted(log["name"] for log in doc["logs"]) == ["inference", "worker"]
        full = log_text(doc, "inference")
        assert full.index("chatty-1") < full.index("chatty-2") < full.index("chatty-3")
        assert not next(log for log in doc["logs"] if log["name"] == "inference")["truncated"]

        one = await logs_of(p.key, iid, lines=1, log="inference")
        assert [log["name"] for log in one["logs"]] == ["inference"]
        assert log_text(one, "inference") == full.splitlines(keepends=True)[-1]
        short = await logs_of(p.key, iid, tail=5, log="inference")
        (clipped,) = short["logs"]
        assert len(clipped["text"].encode()) <= 5 and clipped["truncated"] and clipped["size"] >= len(full.encode())
        worker = await logs_of(p.key, iid, log="worker")
        assert [log["name"] for log in worker["logs"]] == ["worker"]

        for query, word in (({"tail": "lots"}, "tail"), ({"tail": "-1"}, "tail"), ({"log": "kernel"}, "log")):
            bad = await p.key.get(f"/v2/nvcf/instances/{iid}/logs", params=query)
            assert bad.status == 400 and word in bad.detail, (query, bad.body)
        unknown = await p.key.get("/v2/nvcf/instances/no-such-instance/logs")
        assert unknown.status == 404 and "no-such-instance" in unknown.detail

        # The cluster's live status: GPUs used and free, the instance it runs (cluster scopes; admins only).
        status = await p.admin.get(f"{CLUSTERS}/{CLUSTER_A}/status")
        assert status.status == 200, status.body
        live = status.json
        assert (live["clusterName"], live["status"], live["backend"]) == ("local", "healthy", "local")
        assert live["gpus"] == [{"name": "H100", "capacity": 8, "allocated": 1, "available": 7, "discovered": "static"}]
        assert live["instanceCount"] == 1 and live["lastHeartbeatAt"]
        (held,) = live["instances"]
        assert (held["instanceId"], held["functionId"], held["ncaId"]) == (iid, fid, "nvcf-default")
        assert (held["instanceState"], held["requestStatus"]) == ("running", "RequestCompletionAcknowledged")
        assert (await p.key.get(f"{CLUSTERS}/{CLUSTER_A}/status")).status == 403
        assert (await p.admin.get(f"{CLUSTERS}/not-a-cluster/status")).status == 404

        # Undeployed: gone from the listings, its logs still readable while the agent remembers it.
        found = pids([view])
        assert (await p.admin.delete(d)).status == 200
        await all_gone(found)

        async def ended() -> dict[str, Any] | None:
            doc = await logs_of(p.key, iid)
            return doc if doc["instanceState"] == "terminated" else None

        after = await wait_for(ended, timeout=15, what="the instance reported terminated")
        assert "chatty-3" in log_text(after, "inference")
        assert (await p.key.get("/v2/nvcf/instances")).json["instances"] == []

        async def freed() -> dict[str, Any] | None:  # its GPU comes back once the backend has released it
            doc: dict[str, Any] = (await p.admin.get(f"{CLUSTERS}/{CLUSTER_A}/status")).json
            return doc if doc["gpus"][0]["available"] == 8 else None

        final = await wait_for(freed, timeout=15, what="the instance's GPU given back")
        assert final["instanceCount"] == 0 and final["gpus"][0]["allocated"] == 0
        assert cluster_pids(CLUSTER_A) == []


async def test_a_failed_instance_is_listed_as_errored_with_its_cause(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, None, **IMAGES) as p:
        fid, _, d = await create(p.admin, function("broken", containerImage="broken"))
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ERROR", timeout=10)
        reply = await p.key.get("/v2/nvcf/instances", params={"functionId": fid})
        assert reply.status == 200, reply.body
        assert reply.json["instances"], reply.json
        for inst in reply.json["instances"]:
            assert inst["instanceStatus"] == "ERRORED" and inst["terminationCause"] == "image-pull-issues", inst
            assert "/nonexistent/bin/server" in inst["error"] and inst["clusterName"] == "local", inst
        iid = reply.json["instances"][0]["instanceId"]
        doc = await logs_of(p.key, iid)
        assert doc["instanceState"] == "image-pull-issues", doc


@pytest.mark.slow
async def test_a_cluster_whose_agent_does_not_answer_is_a_clear_503_or_504(tmp_path: Path) -> None:
    async with compute_platform(tmp_path) as p:
        registration = {
            "clusterName": "silent",
            "clusterGroupName": "silent",
            "ncaId": "nvcf-default",
            "cloudProvider": "on-prem",
            "nvcaVersion": "2.1.0",
            "region": "us-east-1",
        }
        made = await p.admin.post(CLUSTERS, registration)
        assert made.status == 200, made.body
        cid = made.json["clusterId"]
        # No agent at all: nobody answers on the bus.
        absent = await p.admin.get(f"{CLUSTERS}/{cid}/status")
        assert absent.status == 503, absent.body
        assert "'silent'" in absent.detail and "not connected" in absent.detail

        # An agent that takes the question and never answers: the deadline, then 504.
        async with p.bus.subscribe(subjects.agent_subject("cluster", cid)):
            await p.bus.flush(timeout=5)  # the server has the subscription before the question is asked

            async def deadline() -> Any:
                # On a loaded machine the platform's connection may still see no responder once: asked again.
                reply = await p.admin.get(f"{CLUSTERS}/{cid}/status")
                return reply if reply.status == 504 else None

            stuck = await wait_for(deadline, timeout=30, what="504 from an agent that never answers")
        assert "'silent'" in stuck.detail and "did not answer within 5s" in stuck.detail


@pytest.mark.slow
async def test_a_super_admin_terminates_one_instance_and_its_deployment_replaces_it(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, None) as p:
        _, _, d = await create(p.admin, function())
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        old = view.instance.instance_id

        refused = await p.key.delete(f"/v2/nvcf/instances/{old}")  # the account's own key: not a super admin
        assert refused.status == 403 and "admin:delete_function" in refused.detail
        assert (await p.admin.delete("/v2/nvcf/instances/no-such-instance")).status == 404
        done = await p.admin.delete(f"/v2/nvcf/instances/{old}")
        assert done.status == 204, done.body
        again = await p.admin.delete(f"/v2/nvcf/instances/{old}")
        assert again.status == 404 and old in again.detail  # already on its way out

        async def replaced() -> set[str] | None:
            ids = {v.instance.instance_id for v in await instances(p.bus, CLUSTER_A) if v.instance.state == "running"}
            return ids if ids and old not in ids else None

        (new,) = await wait_for(replaced, timeout=60, what="a replacement instance, the old one gone")
        assert new != old
        await wait_status(p.admin, d, "ACTIVE")
        invoked = await p.key.post(f"/v2/nvcf/pexec/functions/{d.split('/')[-3]}", {"message": "still here"})
        assert invoked.status == 200, invoked.body


async def test_super_admins_see_an_accounts_deployments_and_gpu_usage(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, None) as p:
        fid, vid, d = await create(p.admin, function())
        await deploy(p.admin, d, spec(min_instances=1, max_instances=3))
        await wait_status(p.admin, d, "ACTIVE")
        _, _, idle = await create(p.admin, function("idle"))
        await deploy(p.admin, idle, spec(size=2, min_instances=0, max_instances=2))

        listed = await p.admin.get("/v2/nvcf/accounts/nvcf-default/deployments")
        assert listed.status == 200, listed.body
        mine = {(dep["functionId"], dep["functionVersionId"]) for dep in listed.json["deployments"]}
        assert (fid, vid) in mine and len(mine) == 2
        assert all(dep["ncaId"] == "nvcf-default" for dep in listed.json["deployments"])

        async def placed() -> dict[str, Any] | None:
            reply = await p.admin.get("/v2/nvcf/accounts/nvcf-default/usage/gpus")
            assert reply.status == 200, reply.body
            rows = {row["instanceType"]: row for row in reply.json["gpus"]}
            return rows if rows.get("ON-PREM.GPU.H100_1x", {}).get("placements") == 1 else None

        rows = await wait_for(placed, what="the running instance counted")
        one, two = rows["ON-PREM.GPU.H100_1x"], rows["ON-PREM.GPU.H100_2x"]
        assert (one["gpu"], one["currentMaxUsage"], one["currentMinUsage"]) == ("H100", 3, 1)
        # GPUs, not instances: two instances of two GPUs at most, none placed.
        assert (two["currentMaxUsage"], two["currentMinUsage"], two["placements"]) == (4, 0, 0)

        # Another account's: nothing; an unknown account: 404; the account's own key: not a super admin.
        created = await p.admin.post("/v2/nvcf/accounts/team-b", {"name": "Team B", "adminClientId": "b"})
        assert created.status == 200, created.body
        empty = await p.admin.get("/v2/nvcf/accounts/team-b/usage/gpus")
        assert empty.status == 200 and empty.json == {"gpus": []}
        assert (await p.admin.get("/v2/nvcf/accounts/team-b/deployments")).json == {"deployments": []}
        assert (await p.admin.get("/v2/nvcf/accounts/no-such-account/usage/gpus")).status == 404
        refused = await p.key.get("/v2/nvcf/accounts/nvcf-default/deployments")
        assert refused.status == 403 and "admin:deploy_function" in refused.detail


@pytest.mark.slow
async def test_a_rollover_replaces_instances_one_at_a_time_with_the_old_ones_serving_until_then(
    tmp_path: Path,
) -> None:
    async with compute_platform(tmp_path, None) as p:
        fid, vid, d = await create(p.admin, function())
        await deploy(p.admin, d, spec(min_instances=2, max_instances=2))
        await wait_status(p.admin, d, "ACTIVE")
        first = {v.instance.instance_id for v in await running(p.bus, CLUSTER_A, count=2)}
        path = f"/v2/nvcf/accounts/nvcf-default/rolloverWorkers/functions/{fid}/versions/{vid}"
        one = {"rollOverSpecifications": [{"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "numInstances": 1}]}

        refused = await p.key.put(path, one)  # the account's own key: not a super admin
        assert refused.status == 403 and "admin:deploy_function" in refused.detail
        other = {"rollOverSpecifications": [{"gpu": "L40S", "instanceType": "ON-PREM.GPU.L40S_1x", "numInstances": 1}]}
        unknown = await p.admin.put(path, other)
        assert unknown.status == 400 and "H100 ON-PREM.GPU.H100_1x" in unknown.detail
        assert (await p.admin.put(path, {"rollOverSpecifications": []})).status == 400
        elsewhere = path.replace(vid, "0b4f5e6a-7c8d-4e9f-a0b1-c2d3e4f5a6b7")
        assert (await p.admin.put(elsewhere, one)).status == 404

        rolled = await p.admin.put(path, one)
        assert rolled.status == 200, rolled.body
        assert rolled.json["deployment"]["functionVersionId"] == vid
        fewest = 2

        async def one_replaced() -> set[str] | None:
            nonlocal fewest
            ids = {v.instance.instance_id for v in await instances(p.bus, CLUSTER_A) if v.instance.state == "running"}
            fewest = min(fewest, len(ids))
            return ids if len(ids) == 2 and len(ids & first) == 1 else None

        second = await wait_for(one_replaced, timeout=60, interval=0.02, what="one instance replaced")
        assert fewest == 2, "an old instance stopped before its successor ran"

        # More than there are: every live one, one at a time.
        every = {"rollOverSpecifications": [{**one["rollOverSpecifications"][0], "numInstances": 9}]}
        assert (await p.admin.put(path, every)).status == 200

        async def all_replaced() -> set[str] | None:
            nonlocal fewest
            ids = {v.instance.instance_id for v in await instances(p.bus, CLUSTER_A) if v.instance.state == "running"}
            fewest = min(fewest, len(ids))
            return ids if len(ids) == 2 and not ids & second else None

        await wait_for(all_replaced, timeout=90, interval=0.02, what="both instances replaced")
        assert fewest == 2
        await wait_status(p.admin, d, "ACTIVE")
        invoked = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "still here"})
        assert invoked.status == 200, invoked.body
