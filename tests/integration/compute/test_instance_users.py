"""On a root platform every instance runs as users of its own: a function process, looking around as a
hostile tenant's would (``nvcf_mono.testing.snoop_server``), reads its own secrets and nothing of the
platform, of another instance, or of any worker's environment; what it leaves behind dies with it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
from pathlib import Path

import pytest

from nvcf_mono.plugins.auth import SECRET_FILE
from nvcf_mono.testing.platform import wait_for, wait_status

from .conftest import CLUSTER_A, alive, all_gone, compute_platform, create, deploy, function, pids, running, spec

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="instances run as users of their own only when the platform runs as root"
)

SNOOP = {"images.snoop.command": json.dumps(["{python}", "-m", "nvcf_mono.testing.snoop_server", "--port", "{port}"])}


def uid_of(pid: int) -> int:
    return Path(f"/proc/{pid}").stat().st_uid


@pytest.mark.slow
async def test_a_function_reads_its_own_secrets_and_nothing_of_the_platform_or_other_instances(
    tmp_path: Path,
) -> None:
    async with compute_platform(tmp_path, **SNOOP) as p:
        state = p.host.settings.state_dir
        snoop = function(
            "snoop", containerImage="snoop", inferenceUrl="/snoop", secrets=[{"name": "mine", "value": "m1"}]
        )
        other = function("other", secrets=[{"name": "theirs", "value": "t2"}])
        sid, _, d1 = await create(p.admin, snoop)
        oid, _, d2 = await create(p.admin, other)
        await deploy(p.admin, d1, spec())
        await deploy(p.admin, d2, spec())
        await wait_status(p.admin, d1, "ACTIVE")
        await wait_status(p.admin, d2, "ACTIVE")
        views = {v.function_id: v for v in await running(p.bus, CLUSTER_A, count=2)}
        mine, theirs = (Path(views[f].instance.directory or "") for f in (sid, oid))

        # Four users, none the platform's: no instance shares one with another, nor with its worker.
        users = {proc.role + fid: uid_of(proc.pid) for fid, v in views.items() for proc in v.instance.processes}
        assert len(set(users.values())) == 4 and 0 not in users.values(), users

        secret_paths = [
            state / SECRET_FILE,
            state / "endpoints.json",
            state / "nats" / "auth.json",
            theirs / "secrets.json",
            theirs / "inference.log",
            mine / "worker.log",
        ]
        forbidden = [str(path) for path in secret_paths if path.exists()]
        assert len(forbidden) >= 5, forbidden  # each really is there to be read
        reply = await p.key.post(f"/v2/nvcf/pexec/functions/{sid}", {"paths": [*forbidden, str(mine / "secrets.json")]})
        assert reply.status == 200, reply.body
        seen = reply.json
        assert seen["read"] == {str(mine / "secrets.json"): json.dumps({"mine": "m1"})}
        for path in forbidden:
            assert seen["denied"][path].startswith("PermissionError"), (path, seen["denied"][path])
        # Every worker of the machine is visible by its command line, none by its environment (its token).
        workers = seen["workers"]
        assert {str(proc.pid) for v in views.values() for proc in v.instance.processes if proc.role == "worker"} <= set(
            workers
        )
        assert "read" not in workers.values(), workers
        me = seen["me"]
        assert me["uid"] not in (0, os.getuid()) and me["home"] == str(mine) and 0 not in me["groups"]
        assert me["secrets"] == str(mine / "secrets.json")

        # Its directory is its instance's: the agent's, open to the instance's group and nobody else.
        for directory, view in ((mine, views[sid]), (theirs, views[oid])):
            st = directory.stat()
            assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o1770
            assert st.st_gid == uid_of(next(p.pid for p in view.instance.processes if p.role == "inference"))

        # A daemon that left its process group goes with the instance, and the directory closes behind it.
        daemon = int((mine / "daemon.pid").read_text())
        assert alive(daemon) and uid_of(daemon) == users["inference" + sid]
        assert (await p.admin.delete(d1)).status == 200
        await all_gone([*pids([views[sid]]), daemon])

        async def closed() -> bool:  # after its processes are gone: its mode, then its group (not one step)
            st = mine.stat()
            return stat.S_IMODE(st.st_mode) == 0o700 and st.st_gid == os.getegid()

        await wait_for(closed, timeout=10, what=f"{mine} closed (mode 0700, the platform's group)")
        assert not (mine / "secrets.json").exists()


@pytest.mark.slow
async def test_as_the_platforms_user_a_function_reads_the_platforms_secrets_and_the_start_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``run_as: platform-user`` gives up (the warning at start is true): why instance users exist."""
    settings = {**SNOOP, "plugins.compute.local.run_as": "platform-user"}
    with caplog.at_level(logging.WARNING):
        async with compute_platform(tmp_path, **settings) as p:
            state = p.host.settings.state_dir
            sid, _, d = await create(p.admin, function("snoop", containerImage="snoop", inferenceUrl="/snoop"))
            await deploy(p.admin, d, spec())
            await wait_status(p.admin, d, "ACTIVE")
            (view,) = await running(p.bus, CLUSTER_A)
            assert {uid_of(proc.pid) for proc in view.instance.processes} == {os.geteuid()}
            endpoints = str(state / "endpoints.json")
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{sid}", {"paths": [endpoints]})
            assert "admin_token" in reply.json["read"][endpoints]
            assert "read" in reply.json["workers"].values()
            # Nor does a daemon that left its process group end with the instance: only its own users do that.
            daemon = int((Path(view.instance.directory or "") / "daemon.pid").read_text())
            await p.admin.delete(d)
            await all_gone(pids([view]))
            assert alive(daemon)
            os.kill(daemon, signal.SIGKILL)
    warned = [r.getMessage() for r in caplog.records if "run as this platform's own user" in r.getMessage()]
    assert len(warned) == 1 and str(state) in warned[0] and "platform-secret" in warned[0]


PLANTER = (
    "import os, pathlib, sys; results = pathlib.Path(os.environ['NVCT_RESULTS_DIR']); "
    "(results / 'honest.txt').write_text('mine'); "
    "[os.symlink(target, results / f'stolen-{i}') for i, target in enumerate(sys.argv[1:])]"
)


@pytest.mark.slow
async def test_a_task_cannot_have_its_worker_upload_the_platforms_files_through_links(tmp_path: Path) -> None:
    """Its worker reads what the task leaves in its results directory, but as a user of the task's own."""
    settings = {"images.planter.command": json.dumps(["{python}", "-c", PLANTER])}
    async with compute_platform(tmp_path, **settings) as p:
        state = p.host.settings.state_dir
        body = {
            "name": "planter",
            "containerImage": "planter",
            "containerArgs": f"{state / SECRET_FILE} {state / 'endpoints.json'}",
            "gpuSpecification": {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x"},
        }
        launched = await p.admin.post("/v1/nvct/tasks", body)
        assert launched.status == 200, launched.body
        task_id = launched.json["task"]["id"]

        async def ended() -> dict | None:
            task = (await p.admin.get(f"/v1/nvct/tasks/{task_id}")).json["task"]
            return task if task["status"] in ("COMPLETED", "ERRORED", "CANCELED") else None

        task = await wait_for(ended, timeout=60, what="the task to end")
        assert task["status"] == "COMPLETED", task
        results = (await p.admin.get(f"/v1/nvct/tasks/{task_id}/results")).json["results"]
        assert [r["name"] for r in results] == ["honest.txt"]
