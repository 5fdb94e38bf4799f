"""``nvcf-mono cluster status`` and ``nvcf-mono instance list|logs`` run as users run them, against the real agent.

The commands run in-process; ``instance logs --follow``, whose lines must arrive through a pipe while it
runs and which ends by itself, runs as a child process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest

from nvcf_mono.testing.platform import credentials, wait_status
from tests.e2e.cli import ROOT
from tests.e2e.test_cli_control import cli, env_for, kv, ok
from tests.integration.compute.conftest import (
    CLUSTER_A,
    all_gone,
    compute_platform,
    create,
    deploy,
    function,
    pids,
    running,
    spec,
)

pytestmark = [pytest.mark.e2e]  # a child process (--follow); the platform's nats-server

#: The echo example, printing a numbered tick every 0.2 s (so a follower has something new to show).
TICKING = ["{python}", "-c", "import runpy, sys, threading, time; print('hello-1'); print('hello-2', flush=True); "
           "print('\\x1b]0;owned\\x07\\x1b[2Jcleared\\r', flush=True); "
           "threading.Thread(target=lambda: [print(f'tick-{i}', flush=True) or time.sleep(0.2) for i in range(10**6)], "
           "daemon=True).start(); sys.argv = ['echo', '--port', '{port}']; "
           "runpy.run_module('nvcf_mono.examples.echo', run_name='__main__')"]  # fmt: skip


def follow_until(proc: subprocess.Popen[str], pattern: str, timeout: float) -> list[str]:
    """Lines of ``proc`` up to the first matching ``pattern``; the process is killed if none comes in time."""
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if re.search(pattern, line):
                return seen
    finally:
        watchdog.cancel()
    raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n{''.join(seen)}")


@pytest.mark.slow
async def test_cluster_status_and_instance_commands(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with compute_platform(tmp_path, None, **{"images.ticking.command": json.dumps(TICKING)}) as p:
        creds = credentials(p.host)
        url = ["--api-url", p.host.endpoints.url]
        admin = [*url, "--token", creds["admin_token"]]
        user = [*url, "--api-key", creds["api_key"]]
        fid, vid, d = await create(p.admin, function("ticking", containerImage="ticking"))
        await deploy(p.admin, d, spec())
        await wait_status(p.admin, d, "ACTIVE")
        (view,) = await running(p.bus, CLUSTER_A)
        iid = view.instance.instance_id

        # cluster status, by name and by id.
        shown = ok(await cli("cluster", "status", "local", *admin, env=env))
        head, _, rest = shown.partition("\n\n")
        facts = kv(head)
        assert (facts["name"], facts["cluster id"], facts["status"], facts["backend"]) == (
            "local",
            CLUSTER_A,
            "healthy",
            "local",
        )
        assert facts["gpus"] == "H100 1/8 used, 7 free" and facts["instances"] == "1"
        header, *rows = rest.splitlines()
        assert header.split()[:3] == ["INSTANCE", "ID", "FUNCTION"]
        assert len(rows) == 1 and rows[0].split()[:5] == [iid, fid, vid, "running", "fulfilled"]
        raw = json.loads(ok(await cli("cluster", "status", CLUSTER_A, "--json", *admin, env=env)))
        assert raw["gpus"][0]["available"] == 7 and raw["instances"][0]["instanceId"] == iid
        nope = await cli("cluster", "status", "atlantis", *admin, env=env)
        assert nope.returncode == 1 and "no cluster named 'atlantis'" in nope.stderr, nope.stderr
        assert not nope.stdout

        # instance list, with the function's API key.
        listed = ok(await cli("instance", "list", *user, env=env))
        header, *rows = listed.splitlines()
        assert header.split() == [
            "INSTANCE", "ID", "FUNCTION", "ID", "VERSION", "ID", "STATUS", "STATE", "CLUSTER", "INSTANCE", "TYPE",
            "RESTARTS",
        ]  # fmt: skip
        assert len(rows) == 1
        assert rows[0].split() == [iid, fid, vid, "ACTIVE", "running", "local", "ON-PREM.GPU.H100_1x", "0"]
        doc = json.loads(
            ok(await cli("instance", "list", "--function", fid, "--version", vid, "--cluster", "local", "--json",
                         *user, env=env))
        )  # fmt: skip
        assert [i["instanceId"] for i in doc["instances"]] == [iid]
        # function get ends with the version's instances.
        head, _, rest = ok(await cli("function", "get", fid, vid, *user, env=env)).partition("\n\n")
        assert kv(head)["instances"] == "1"
        header, *rows = rest.splitlines()
        assert header.split()[:4] == ["INSTANCE", "ID", "STATUS", "GPU"]
        assert len(rows) == 1 and rows[0].split()[:3] == [iid, "ACTIVE", "H100"], rows
        lone = await cli("instance", "list", "--version", vid, *user, env=env)
        assert lone.returncode == 2 and "--version needs --function" in lone.stderr
        unknown = await cli("instance", "list", "--function", "no-such-function", *user, env=env)
        assert unknown.returncode == 1 and "HTTP 404" in unknown.stderr and "no-such-function" in unknown.stderr

        # instance logs: both logs under headers; one log, last lines only.
        both = ok(await cli("instance", "logs", iid, *user, env=env))
        assert both.startswith("==> inference <==\n") and "\nhello-1\nhello-2\n" in both
        assert both.index("hello-2") < both.index("\n==> worker <==\n")
        # What the server wrote reaches a pipe as written, a terminal escaped (unless --raw).
        hostile = "\x1b]0;owned\x07\x1b[2Jcleared\r\n"
        assert hostile in both
        shown = ok(await cli("instance", "logs", iid, "--log", "inference", *user, env=env, tty=True))
        assert "\nhello-2\n\\x1b]0;owned\\x07\\x1b[2Jcleared\ntick-" in shown and "\x1b" not in shown, shown
        raw = ok(await cli("instance", "logs", iid, "--log", "inference", "--raw", *user, env=env, tty=True))
        assert hostile in raw
        last = ok(await cli("instance", "logs", iid, "--log", "inference", "--tail", "1", *user, env=env))
        assert re.fullmatch(r"tick-\d+\n", last), last
        as_json = json.loads(ok(await cli("instance", "logs", iid, "--json", "--bytes", "10", *user, env=env)))
        assert {log["name"] for log in as_json["logs"]} == {"inference", "worker"}
        assert all(log["truncated"] and len(log["text"].encode()) <= 10 for log in as_json["logs"])
        missing = await cli("instance", "logs", "no-such-instance", *user, env=env)
        assert missing.returncode == 1 and "HTTP 404" in missing.stderr and "no-such-instance" in missing.stderr
        mixed = await cli("instance", "logs", iid, "--json", "--follow", *user, env=env)
        assert mixed.returncode == 2 and "--follow" in mixed.stderr
        negative = await cli("instance", "logs", iid, "--tail", "-3", *user, env=env)
        assert negative.returncode == 2 and "must be 0 or more" in negative.stderr

        # --follow prints what is written next, and ends by itself when the instance does.
        argv = [sys.executable, "-m", "nvcf_mono", "instance", "logs", iid, "--log", "inference", "--tail", "1",
                "--follow", "--interval", "0.2", *user]  # fmt: skip
        follower = await anyio.to_thread.run_sync(
            lambda: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        )
        try:
            (first,) = await anyio.to_thread.run_sync(lambda: follow_until(follower, r"^tick-\d+$", 30))
            start = int(first.strip().removeprefix("tick-"))
            later = await anyio.to_thread.run_sync(lambda: follow_until(follower, rf"^tick-{start + 3}$", 30))
            ticks = [int(line.strip().removeprefix("tick-")) for line in later if line.startswith("tick-")]
            assert ticks == list(range(start + 1, start + 4)), later  # every new line once, in order

            found = pids([view])
            assert (await p.admin.delete(d)).status == 200
            await all_gone(found)
            code = await anyio.to_thread.run_sync(lambda: follower.wait(timeout=30))
            assert code == 0, follower.stderr.read() if follower.stderr else ""
        finally:
            if follower.poll() is None:
                follower.kill()
            follower.wait()
            for stream in (follower.stdout, follower.stderr):
                if stream is not None:
                    stream.close()
