"""End to end on the real agent and the local backend: register, deploy, invoke, undeploy, nothing left behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from nvcf_mono.contracts import rpc, subjects
from nvcf_mono.contracts.agent import AgentCluster, AgentQuery
from nvcf_mono.testing.platform import deployment, wait_for, wait_status

from .conftest import (
    CLUSTER_A,
    CLUSTER_B,
    all_gone,
    cluster,
    cluster_pids,
    compute_platform,
    create,
    deploy,
    environ_of,
    function,
    instances,
    pids,
    running,
    spec,
)

CLUSTERS = "/v1/accounts/nvcf-default/clusters"


@pytest.mark.slow
async def test_deploy_invoke_undeploy_leaves_no_process(tmp_path: Path) -> None:
    async with compute_platform(tmp_path) as p:
        fid, vid, d = await create(p.admin, function(containerEnvironment=[{"key": "GREETING", "value": "hi"}]))
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "hi", "repeats": 3})
        assert reply.status == 200, reply.body
        assert reply.json["message"] == "hihihi"

        (view,) = await running(p.bus, CLUSTER_A)
        assert view.function_id == fid and view.function_version_id == vid
        assert view.request_status.value == "RequestCompletionAcknowledged"
        procs = {proc.role: proc.pid for proc in view.instance.processes}
        assert set(procs) == {"inference", "worker"}
        inference, worker = environ_of(procs["inference"]), environ_of(procs["worker"])
        # The worker token goes to the worker only; both see the instance's own port, not inferencePort 9000.
        assert "NVCF_WORKER_TOKEN" not in inference and worker["NVCF_WORKER_TOKEN"].startswith("nvcft_")
        port = str(view.instance.port)
        assert inference["INFERENCE_PORT"] == inference["PORT"] == port == worker["INFERENCE_PORT"] != "9000"
        assert worker["INFERENCE_HEALTH_PORT"] == port and worker["HEALTH_PORT"] == str(view.instance.health_port)
        assert inference["CUDA_VISIBLE_DEVICES"] == "0" and inference["GREETING"] == "hi"
        assert inference["INSTANCE_ID"] == worker["INSTANCE_ID"] == view.instance.instance_id
        assert inference["NVCF_FUNCTION_ID"] == fid and inference["NVCF_INSTANCETYPE"] == "ON-PREM.GPU.H100_1x"
        assert worker["SECRETS_FILE"] == str(Path(view.instance.directory or "") / "secrets.json")
        logs = Path(view.instance.directory or "")
        assert (logs / "inference.log").exists() and (logs / "worker.log").exists()

        found = pids([view])
        assert sorted(cluster_pids(CLUSTER_A)) == sorted(found)
        status = await rpc.call(p.bus, subjects.agent_subject("cluster", CLUSTER_A), AgentQuery(), AgentCluster)
        assert [(g.name, g.capacity, g.allocated) for g in status.gpus] == [("H100", 8, 1)]
        async with p.admin.session.get(f"{p.admin.base}/metrics") as resp:
            metrics = await resp.text()
        assert 'nvcf_compute_gpus{cluster="local",gpu="H100",kind="allocated"} 1' in metrics
        assert 'nvcf_compute_instances{cluster="local",state="running"} 1' in metrics

        removed = await p.admin.delete(d)
        assert removed.status == 200
        await all_gone(found)
        assert cluster_pids(CLUSTER_A) == []
        fn = await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}")
        assert fn.json["function"]["status"] == "INACTIVE"

        async def reported_gone() -> bool:
            held = await instances(p.bus, CLUSTER_A, finished=True)
            return [v.instance.state for v in held] == ["terminated"] and held[0].instance.status == (
                "instance-terminated-by-user"
            )

        await wait_for(reported_gone, what="the instance reported terminated by user")

        async def released() -> bool:  # the GPU count comes with the agent's next report
            listed = await p.admin.get(f"{CLUSTERS}/{CLUSTER_A}")
            return bool(listed.json["gpuUsage"]["H100"]["allocated"] == 0)

        await wait_for(released, what="the instance's GPU released in the cluster's usage")

        # A cluster the control plane forgot registers again (its heartbeat is answered REGISTER).
        assert (await p.admin.delete(f"{CLUSTERS}/{CLUSTER_A}")).status in (200, 204)

        async def registered_again() -> bool:
            return (await p.admin.get(f"{CLUSTERS}/{CLUSTER_A}")).status == 200

        await wait_for(registered_again, what="the cluster registered again")


@pytest.mark.slow
async def test_two_clusters_of_different_gpus_and_the_spec_picks_one(tmp_path: Path) -> None:
    clusters = [cluster("alpha", CLUSTER_A, "H100", 8), cluster("beta", CLUSTER_B, "L40S", 4)]
    # The Helm function below never gets to render its (made-up) chart: the control plane does not fetch it.
    async with compute_platform(tmp_path, clusters, **{"plugins.control.helm.enabled": "false"}) as p:

        async def both_registered() -> dict[str, dict] | None:  # agents register just after the host is ready
            groups = (await p.admin.get("/v2/nvcf/clusterGroups")).json["clusterGroups"]
            found = {g["name"]: g for g in groups}
            return found if set(found) == {"alpha", "beta"} else None

        by_name = await wait_for(both_registered, timeout=10, what="both clusters registered")
        assert [t["name"] for t in by_name["beta"]["gpus"][0]["instanceTypes"]] == [
            "ON-PREM.GPU.L40S_1x",
            "ON-PREM.GPU.L40S_2x",
            "ON-PREM.GPU.L40S_4x",
        ]
        cluster_a = (await p.admin.get(f"{CLUSTERS}/{CLUSTER_A}")).json
        assert cluster_a["capabilities"] == []  # local processes: no Helm

        l40s_fid, _, l40s = await create(p.admin, function("on-beta"))
        await deploy(p.admin, l40s, spec("L40S", backend="beta"))
        h100_fid, _, h100 = await create(p.admin, function("on-alpha"))
        await deploy(p.admin, h100, spec("H100", size=2, backend="alpha"))
        await wait_status(p.admin, l40s, "ACTIVE")
        await wait_status(p.admin, h100, "ACTIVE")
        (on_beta,) = await running(p.bus, CLUSTER_B)
        (on_alpha,) = await running(p.bus, CLUSTER_A)
        assert on_beta.function_id == l40s_fid and on_alpha.function_id == h100_fid
        assert len(on_alpha.instance.devices) == 2 and len(on_beta.instance.devices) == 1
        inference = next(proc.pid for proc in on_alpha.instance.processes if proc.role == "inference")
        assert environ_of(inference)["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, on_alpha.instance.devices))
        for fid in (l40s_fid, h100_fid):
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": fid})
            assert reply.status == 200 and reply.json["message"] == fid

        # A Helm function cannot go to clusters that run local processes: refused up front.
        helm = {
            "name": "chart",
            "inferenceUrl": "/echo",
            "inferencePort": 8000,
            "helmChart": "https://helm.example.com/acme/charts/echo-1.0.0.tgz",
            "helmChartServiceName": "echo",
        }
        _, _, chart = await create(p.admin, helm)
        refused = await p.admin.post(chart, {"deploymentSpecifications": [spec("H100")]})
        assert refused.status == 400 and "container functions only" in refused.detail
        assert (await deployment(p.admin, h100))["functionStatus"] == "ACTIVE"


READS_SECRETS = [
    "{python}",
    "-c",
    "import json, os, runpy, sys; s = json.load(open(os.environ['SECRETS_FILE'])); print('secrets:', sorted(s)); "
    "sys.argv = ['echo', '--port', os.environ['PORT']]; runpy.run_module('nvcf_mono.testing.echo_server', "
    "run_name='__main__')",
]


@pytest.mark.slow
async def test_secrets_are_written_for_the_instance_alone_before_the_server_starts(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **{"images.reads-secrets.command": json.dumps(READS_SECRETS)}) as p:
        body = function("secretive", containerImage="reads-secrets", secrets=[{"name": "token", "value": "s3cr3t"}])
        fid, _, d = await create(p.admin, body)
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        assert view.instance.restarts == 0  # the server found its secrets at its first start
        secrets = Path(view.instance.directory or "") / "secrets.json"
        # The worker writes it, the server reads it: the instance's group may, nobody else (and on a root platform
        # the group is the instance's own, in a directory only the instance's users enter).
        found = secrets.stat()
        assert stat.S_IMODE(found.st_mode) == 0o640
        if os.geteuid() == 0:
            directory = secrets.parent.stat()
            assert found.st_uid != 0 and found.st_gid == directory.st_gid != 0
            assert stat.S_IMODE(directory.st_mode) == 0o1770 and directory.st_uid == 0
        assert json.loads(secrets.read_text()) == {"token": "s3cr3t"}
        assert "secrets: ['token']" in (secrets.parent / "inference.log").read_text()
        assert (await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "x"})).status == 200
        await p.admin.delete(d)
        await all_gone(pids([view]))

        async def removed() -> bool:
            return not secrets.exists()

        await wait_for(removed, what="the secrets file removed with the instance")


#: The secrets-reading server, and workers that fetch secrets again every half second.
REFRESHING = {"images.reads-secrets.command": json.dumps(READS_SECRETS), "plugins.compute.local.secrets_refresh": "0.5"}


async def test_updated_secrets_reach_the_running_instance_within_seconds(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **REFRESHING) as p:
        body = function("rotating", containerImage="reads-secrets", secrets=[{"name": "token", "value": "first"}])
        fid, vid, d = await create(p.admin, body)
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        secrets = Path(view.instance.directory or "") / "secrets.json"
        assert json.loads(secrets.read_text()) == {"token": "first"}
        before = pids([view])

        update = {"secrets": [{"name": "token", "value": "second"}, {"name": "added", "value": {"k": 1}}]}
        assert (await p.admin.put(f"/v2/nvcf/secrets/functions/{fid}/versions/{vid}", update)).status == 204

        async def rewritten() -> dict[str, object] | None:
            doc = json.loads(secrets.read_text())
            return doc if doc.get("token") == "second" else None

        # Merged over the old ones (NVCF's rule), written whole (never a partial file), the instance untouched.
        assert await wait_for(rewritten, timeout=15, what="the new secrets in the file") == {
            "token": "second",
            "added": {"k": 1},
        }
        assert stat.S_IMODE(secrets.stat().st_mode) == 0o640
        (again,) = await running(p.bus, CLUSTER_A)
        assert again.instance.restarts == 0 and pids([again]) == before
        assert not [f for f in secrets.parent.iterdir() if f.name.startswith(".secrets.json.")]  # no scratch left


@pytest.mark.slow
async def test_account_secrets_reach_the_instance_beside_its_own_and_follow_changes(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **REFRESHING) as p:
        account = [{"name": "region-key", "value": "acct-1"}, {"name": "token", "value": "account's"}]
        assert (await p.admin.put("/v2/nvcf/secrets/account", {"secrets": account})).status == 204
        body = function("with-account", containerImage="reads-secrets", secrets=[{"name": "token", "value": "own"}])
        _, _, d = await create(p.admin, body)
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        secrets = Path(view.instance.directory or "") / "secrets.json"
        assert json.loads(secrets.read_text()) == {"region-key": "acct-1", "token": "own"}
        assert "secrets: ['region-key', 'token']" in (secrets.parent / "inference.log").read_text()

        change = {"secrets": [{"name": "region-key", "value": "acct-2"}]}
        assert (await p.admin.put("/v2/nvcf/secrets/account", change)).status == 204

        async def rotated() -> bool:
            return bool(json.loads(secrets.read_text()).get("region-key") == "acct-2")

        await wait_for(rotated, timeout=15, what="the account's changed secret in the running instance")
        assert json.loads(secrets.read_text())["token"] == "own"

        # A function without secrets of its own still gets the account's.
        _, _, d2 = await create(p.admin, function("bare", containerImage="reads-secrets"))
        await deploy(p.admin, d2, spec())
        await wait_status(p.admin, d2, "ACTIVE")
        (bare,) = [v for v in await running(p.bus, CLUSTER_A) if v.instance.directory != view.instance.directory]
        found = json.loads((Path(bare.instance.directory or "") / "secrets.json").read_text())
        assert found == {"region-key": "acct-2", "token": "account's"}


async def test_an_instance_started_without_secrets_gets_the_accounts_first_ones(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **REFRESHING) as p:
        _, _, d = await create(p.admin, function("none-yet"))  # echo: reads no secrets, needs none
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        secrets = Path(view.instance.directory or "") / "secrets.json"
        assert not secrets.exists()  # nothing to read yet: no file, as at launch
        before = pids([view])

        first = {"secrets": [{"name": "region-key", "value": "acct-1"}]}
        assert (await p.admin.put("/v2/nvcf/secrets/account", first)).status == 204

        async def arrived() -> bool:
            return secrets.exists() and json.loads(secrets.read_text()) == {"region-key": "acct-1"}

        await wait_for(arrived, timeout=15, what="the account's first secret in the running instance")
        (again,) = await running(p.bus, CLUSTER_A)
        assert again.instance.restarts == 0 and pids([again]) == before
        assert (await p.admin.delete(d)).status == 200
        await all_gone(before)
