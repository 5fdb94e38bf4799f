"""``nvcf-mono invoke`` as users run it: a child process against a live platform with a real instance."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import anyio
import pytest

from nvcf_mono.testing.platform import credentials
from nvcf_mono.testing.running import Platform, deployed, launching_agent, platform
from tests.e2e.cli import ROOT, cli_env

pytestmark = pytest.mark.e2e

# The developer's own settings must not leak into the child.
_OURS = ("NVCF_API_URL", "NVCF_TOKEN", "NVCF_API_KEY", "NVCF_MONO_STATE_DIR")


def env_for(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in cli_env().items() if k not in _OURS}
    env["NVCF_MONO_STATE_DIR"] = str(tmp_path / "no-state")
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "nvcf_mono", *args]


async def invoke(
    *args: str, env: dict[str, str], timeout: float = 60, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """Run ``nvcf-mono invoke`` in a thread (the platform in this event loop keeps serving); stdout as bytes."""
    argv = command("invoke", *args)
    return await anyio.to_thread.run_sync(
        lambda: subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, env=env, cwd=ROOT)
    )


def connection(p: Platform, api_key: str | None = None) -> list[str]:
    return ["--api-url", p.host.endpoints.url, "--api-key", api_key or credentials(p.host)["api_key"]]


def ok(result: subprocess.CompletedProcess[bytes]) -> bytes:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout!r}\nstderr:\n{result.stderr!r}"
    return result.stdout


@pytest.mark.slow
async def test_invoke_prints_the_answer_follows_202s_and_streams(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, vid = await deployed(p.admin)
        conn = connection(p)

        answer = json.loads(ok(await invoke(fid, "--data", '{"message": "hi", "repeats": 2}', *conn, env=env)))
        assert answer["message"] == "hihi"

        pinned = await invoke(fid, "--version", vid, "--data", '{"message": "v"}', "--json", *conn, env=env)
        doc = json.loads(ok(pinned))
        assert doc["httpStatus"] == 200 and doc["status"] == "fulfilled"
        assert doc["response"]["message"] == "v" and doc["reqId"] == doc["response"]["reqid"]

        # Past the poll window: a 202, then polling, with progress on stderr.
        late = await invoke(fid, "--data", '{"message": "late", "delay": 2}', "--poll-seconds", "1", *conn, env=env)
        body = json.loads(ok(late))
        assert body["message"] == "late"
        progress = late.stderr.decode()
        assert f"request {body['reqid']}: " in progress, progress
        assert any(reason in progress for reason in ("queued", "running")), progress

        # Bytes in and out as they are, with a header of the caller's choosing.
        blob = bytes(range(256)) * 64
        (tmp_path / "blob.bin").write_bytes(blob)
        raw = await invoke(
            fid, "--data", f"@{tmp_path / 'blob.bin'}", "-H", "Content-Type: application/x-blob", *conn, env=env
        )
        assert ok(raw) == blob
        saved = await invoke(
            fid, "--data", f"@{tmp_path / 'blob.bin'}", "-o", str(tmp_path / "out.bin"), *conn, env=env
        )
        assert ok(saved) == b"" and (tmp_path / "out.bin").read_bytes() == blob
        assert f"saved {tmp_path / 'out.bin'} ({len(blob)} bytes)" in saved.stderr.decode()
        piped = await invoke(fid, "--data", "@-", "-H", "Content-Type: application/x-blob", *conn, env=env, stdin=blob)
        assert ok(piped) == blob
        piped_json = await invoke(fid, "--data", "@-", *conn, env=env, stdin=b'{"message": "from a pipe"}')
        assert json.loads(ok(piped_json))["message"] == "from a pipe"
        # Too large to return directly (over 5 MiB): a 302 to its download, which -o follows (a zip).
        large = {"message": "x" * 1000, "repeats": 6000}
        zipped = await invoke(fid, "--data", json.dumps(large), "-o", str(tmp_path / "large.zip"), *conn, env=env)
        ok(zipped)
        with zipfile.ZipFile(tmp_path / "large.zip") as archive:
            (member,) = archive.namelist()
            assert json.loads(archive.read(member))["message"] == "x" * 6_000_000
        both = await invoke(fid, "--data", "{}", "-o", str(tmp_path / "x"), "--json", *conn, env=env)
        assert both.returncode == 2 and b"choose one" in both.stderr

        # Server-sent events are printed as they arrive, before the stream ends.
        events = {"message": "s", "repeats": 3, "delay": 1.5, "stream": True}
        argv = command("invoke", fid, "--stream", "--data", json.dumps(events), *conn)
        proc = await anyio.to_thread.run_sync(
            lambda: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        )
        try:
            assert proc.stdout is not None
            first = await anyio.to_thread.run_sync(proc.stdout.readline)
            arrived_while_running = proc.poll() is None
            rest, errors = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, errors
        assert arrived_while_running, "the first event was printed only after the stream ended"
        lines = [line for line in (first + rest).decode().splitlines() if line.startswith("data: ")]
        assert [json.loads(line[6:])["index"] for line in lines] == [0, 1, 2]


@pytest.mark.slow
async def test_invoke_exits_1_with_the_problem_detail(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p:
        conn = connection(p)
        missing = str(uuid.uuid4())
        started = time.monotonic()
        unknown = await invoke(missing, "--data", "{}", *conn, env=env)
        assert unknown.returncode == 1
        assert f"HTTP 404: function '{missing}' not found" in unknown.stderr.decode()
        assert unknown.stdout == b""  # a platform problem is not the function's answer
        assert time.monotonic() - started < 30

        denied = await invoke(missing, "--data", "{}", *connection(p, "nvapi-not-a-real-key"), env=env)
        assert denied.returncode == 1 and "HTTP 401" in denied.stderr.decode()

        as_json = await invoke(missing, "--data", "{}", "--json", *conn, env=env)
        assert as_json.returncode == 1 and json.loads(as_json.stdout)["httpStatus"] == 404

        # Usage errors: exit 2 before anything is sent.
        for args, needle in (
            (["--data", "{not json"], "--data"),
            (["--data", "@" + str(tmp_path / "absent.json")], "absent.json"),
            (["--data", "{}", "--header", "no-colon"], "--header"),
            (["--data", "{}", "--poll-seconds", "0"], "--poll-seconds"),
        ):
            bad = await invoke(missing, *args, *conn, env=env)
            assert bad.returncode == 2 and needle in bad.stderr.decode(), (args, bad.stderr)
