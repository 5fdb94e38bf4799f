"""The API commands as users run them: ``nvcf-mono function|deploy|api-key|cluster`` against a live platform.

The commands run in-process (``cli.main`` in a thread, the platform serving in this event loop); Ctrl-C,
which only a process can receive, is sent to a child process.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.contracts import buckets
from nvcf_mono.models.cluster import MaintenanceMode
from nvcf_mono.testing.platform import credentials, wait_for
from tests.e2e.cli import ROOT, cli_env, run_cli
from tests.function_charts import write_chart
from tests.integration.control.conftest import CONTAINER_FUNCTION, Platform, agent, platform
from tests.integration.control.test_queues import enqueue, new_function, request_stream
from tests.integration.control.test_registry_credentials import control_store
from tests.integration.control.test_secrets import fetch, worker_token
from tests.support.procs import describe

H100 = ["--gpu", "H100", "--instance-type", "ON-PREM.GPU.H100_1x"]
# The developer's own settings must not leak into the command.
_OURS = ("NVCF_API_URL", "NVCF_TOKEN", "NVCF_API_KEY", "NVCF_MONO_STATE_DIR")


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The command's environment: no NVCF_* credentials of the caller, an empty default state dir."""
    env = {k: v for k, v in cli_env().items() if k not in _OURS}
    env["NVCF_MONO_STATE_DIR"] = str(tmp_path / "no-state")
    env.update(extra)
    return env


async def cli(
    *args: str, env: dict[str, str], tty: bool = False, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI in-process, in a thread so the platform in this event loop keeps serving."""
    return await anyio.to_thread.run_sync(lambda: run_cli(*args, env=env, tty=tty, stdin=stdin))


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def kv(text: str) -> dict[str, str]:
    """The ``key: value`` lines of a command's output."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z][a-z ]*):\s+(.*)$", line)
        if m:
            out[m[1]] = m[2]
    return out


def flags(p: Platform) -> list[str]:
    creds = credentials(p.host)
    return ["--api-url", p.host.endpoints.url, "--token", creds["admin_token"]]


@pytest.fixture
def dead() -> Iterator[str]:
    """The URL of a port bound and not listening: connections are refused, and while the test runs no
    other server (its own platform included) can be given that port.
    """
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


async def test_function_commands_with_flags(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p:
        conn = flags(p)
        created = kv(
            ok(
                await cli(
                    "function", "create", "--name", "echo", "--image", "registry.example.com/echo:1",
                    "--inference-url", "/echo", "--inference-port", "9000", "--health-uri", "/health",
                    "--container-env", "A=1", "B=x=y", "--secrets", "S1=hush", "--tags", "a,b",
                    "--description", "an echo", "--rate-limit", "10-S", "--container-args=--verbose",
                    *conn, env=env,
                )
            )
        )  # fmt: skip
        fid, vid = created["function id"], created["version id"]
        assert created["status"] == "INACTIVE" and created["name"] == "echo"
        stored = (await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}?includeSecrets=true")).json["function"]
        # Health defaults are filled the way NVCF fills them: the inference port, PT10S, 200, HTTP.
        assert stored["health"] == {
            "protocol": "HTTP",
            "uri": "/health",
            "port": 9000,
            "timeout": "PT10S",
            "expectedStatusCode": 200,
        }
        assert stored["containerEnvironment"] == [{"key": "A", "value": "1"}, {"key": "B", "value": "x=y"}]
        assert stored["secrets"] == ["S1"]
        assert stored["tags"] == ["a", "b"]
        assert stored["rateLimit"] == {"rateLimit": "10-S"}
        assert stored["containerArgs"] == "--verbose"
        assert stored["description"] == "an echo"

        spec = tmp_path / "v2.json"
        spec.write_text(json.dumps({**CONTAINER_FUNCTION, "containerImage": "registry.example.com/echo:2"}))
        second = kv(
            ok(await cli("function", "create", "--function-id", fid, "--input-file", str(spec), *conn, env=env))
        )
        assert second["function id"] == fid
        vid2 = second["version id"]
        assert vid2 != vid

        listed = ok(await cli("function", "list", *conn, env=env))
        header, *rows = listed.splitlines()
        assert header.split() == ["FUNCTION", "ID", "VERSION", "ID", "NAME", "STATUS", "TYPE", "CREATED"]
        assert sorted(row.split()[1] for row in rows) == sorted([vid, vid2])
        as_json = json.loads(ok(await cli("function", "list", "--json", *conn, env=env)))
        assert {fn["versionId"] for fn in as_json["functions"]} == {vid, vid2}
        assert json.loads(
            ok(await cli("function", "list", "--visibility", "authorized", "--json", *conn, env=env))
        ) == {"functions": []}

        shown = kv(ok(await cli("function", "get", fid, vid, "--include-secrets", *conn, env=env)))
        assert shown["secrets"] == "S1"
        assert shown["health"] == "HTTP /health on port 9000 (timeout PT10S, expects 200)"
        assert shown["container env"] == "A=1, B=x=y"
        assert shown["image"] == "registry.example.com/echo:1"
        assert "secrets" not in kv(ok(await cli("function", "get", fid, vid, *conn, env=env)))
        both = ok(await cli("function", "get", fid, "--include-secrets", *conn, env=env))
        assert both.count("function id:") == 2 and vid in both and vid2 in both and "secrets:" in both
        versions = json.loads(ok(await cli("function", "versions", fid, "--json", *conn, env=env)))
        assert [fn["versionId"] for fn in versions["functions"]] == [vid, vid2]

        updated = kv(
            ok(await cli("function", "update", fid, vid, "--tags", "c", "--description", "renamed", *conn, env=env))
        )
        assert updated["tags"] == "c" and updated["description"] == "renamed"
        again = (await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}")).json["function"]
        assert again["tags"] == ["c"] and again["rateLimit"] == {"rateLimit": "10-S"}

        deleted = await cli("function", "delete", fid, vid2, *conn, env=env)
        assert ok(deleted).strip() == f"deleted version {vid2} of function {fid}"
        assert (await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid2}")).status == 404
        only = kv(ok(await cli("function", "update", fid, "--tags", "d", *conn, env=env)))  # its one version left
        assert only["version id"] == vid and only["tags"] == "d"
        gone = await cli("function", "get", fid, vid2, *conn, env=env)
        assert gone.returncode == 1
        assert gone.stderr.startswith("nvcf-mono: HTTP 404: "), gone.stderr
        assert gone.stdout == ""


async def test_function_create_and_update_from_files_with_env_credentials(tmp_path: Path) -> None:
    chart = write_chart(tmp_path / "charts")
    async with platform(tmp_path, **{"plugins.control.helm.allow_local_charts": "true"}) as p:
        env = env_for(tmp_path, NVCF_API_URL=p.host.endpoints.url, NVCF_TOKEN=credentials(p.host)["admin_token"])
        body = tmp_path / "fn.json"
        body.write_text(
            json.dumps(
                {**CONTAINER_FUNCTION, "name": "fromfile", "tags": ["file"], "secrets": [{"name": "K", "value": "1"}]}
            )
        )
        doc = json.loads(
            ok(
                await cli(
                    "function", "create", "--input-file", str(body), "--name", "override", "--secrets", "L=2",
                    "--health-timeout", "PT30S", "--json", env=env,
                )
            )
        )  # fmt: skip
        fn = doc["function"]
        assert fn["name"] == "override"  # flags beat the file
        assert fn["tags"] == ["file"]  # the rest of the file is kept
        assert fn["secrets"] == ["K", "L"]
        # The file's health object is kept, the flag changes one field of it.
        assert fn["health"] == {**CONTAINER_FUNCTION["health"], "timeout": "PT30S"}

        patch = tmp_path / "update.json"
        patch.write_text(json.dumps({"tags": ["x", "y"], "rateLimit": {"rateLimit": "5-S", "syncCheck": True}}))
        upd = json.loads(
            ok(
                await cli(
                    "function", "update", fn["id"], fn["versionId"], "--input-file", str(patch), "--rate-limit",
                    "7-M", "--json", env=env,
                )
            )
        )["function"]  # fmt: skip
        assert upd["tags"] == ["x", "y"]
        assert upd["rateLimit"] == {"rateLimit": "7-M", "syncCheck": True}

        helm = await cli(
            "function", "create", "--name", "h", "--helm-chart", f"file://{chart}",
            "--helm-chart-service", "inference-svc", "--inference-url", "/x", "--inference-port", "8001", "--json",
            env=env,
        )  # fmt: skip
        assert json.loads(ok(helm))["function"]["helmChartServiceName"] == "inference-svc"

        # Telemetry endpoints: the file's and the flags' together.
        tel = await p.admin.post(
            "/v2/nvcf/telemetries",
            {
                "endpoint": "https://otel.example.com",
                "protocol": "HTTP",
                "provider": "OTEL_COLLECTOR",
                "types": ["LOGS", "TRACES"],
                "secret": {"name": "collector", "value": "token"},
            },
        )
        tid = tel.json["telemetry"]["telemetryId"]
        body.write_text(json.dumps({**CONTAINER_FUNCTION, "name": "observed", "telemetries": {"logsTelemetryId": tid}}))
        observed = await cli(
            "function", "create", "--input-file", str(body), "--traces-telemetry-id", tid, "--json", env=env
        )  # fmt: skip
        assert json.loads(ok(observed))["function"]["telemetries"] == {"logsTelemetryId": tid, "tracesTelemetryId": tid}

        bad = tmp_path / "bad.json"
        bad.write_text("[1, 2]")
        refused = await cli("function", "create", "--input-file", str(bad), env=env)
        assert refused.returncode == 2
        assert refused.stderr.strip() == f"nvcf-mono: --input-file {bad}: expected a JSON object, got list"
        piped = {**CONTAINER_FUNCTION, "name": "piped"}
        from_stdin = await cli(
            "function", "create", "--input-file", "-", "--json", env=env, stdin=json.dumps(piped).encode()
        )
        assert json.loads(ok(from_stdin))["function"]["name"] == "piped"
        no_stdin = await cli("function", "create", "--input-file", "-", env=env)
        assert no_stdin.returncode == 2
        assert no_stdin.stderr.strip() == "nvcf-mono: --input-file -: there is no standard input to read"
        server_says = await cli("function", "create", "--name", "n", "--inference-url", "/x", env=env)
        assert server_says.returncode == 1
        assert server_says.stderr.strip() == (
            "nvcf-mono: HTTP 400: One of the following properties 'containerImage', 'models', or 'helmChart' "
            "must be specified"
        )


@pytest.mark.slow
async def test_deploy_waits_for_active_then_rescales_and_removes(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p, agent(p.bus) as fake:
        # Credentials and URL from the platform's endpoints.json.
        conn = ["--state-dir", str(p.host.settings.state_dir)]
        fn = json.loads(ok(await cli("function", "create", "--input-file", _write(tmp_path), "--json", *conn, env=env)))
        fid, vid = fn["function"]["id"], fn["function"]["versionId"]

        done = await cli("deploy", "create", fid, vid, *H100, "--min-instances", "2", *conn, env=env)
        out = kv(ok(done))
        assert out["status"] == "ACTIVE"
        assert out["function id"] == fid and out["deployment id"]
        progress = done.stderr.splitlines()
        assert progress, "no progress on stderr"
        assert all(re.match(r"^\[\s*\d+s\] (DEPLOYING|ACTIVE)  H100 ON-PREM\.GPU\.H100_1x: ", ln) for ln in progress)
        assert progress[-1].endswith("ACTIVE  H100 ON-PREM.GPU.H100_1x: 2/2 running"), progress
        assert len(fake.live()) == 2

        got = json.loads(ok(await cli("deploy", "get", fid, vid, "--json", *conn, env=env)))
        dep = got["deployment"]
        assert dep["functionStatus"] == "ACTIVE"
        spec = dep["deploymentSpecifications"][0]
        assert spec["placement"]["runningInstances"] == 2
        table = ok(await cli("deploy", "get", fid, *conn, env=env))  # the function's only version
        assert re.search(
            rf"^{spec['gpuSpecificationId']}\s+H100\s+ON-PREM\.GPU\.H100_1x\s+2\s+2\s+1\s+any\s+2/2", table, re.M
        )

        async def decided() -> str | None:
            shown = ok(await cli("deploy", "get", fid, vid, *conn, env=env))
            return shown if "autoscaler (last decision, why):" in shown else None

        why = await wait_for(decided, timeout=15, what="the autoscaler's decision in deploy get")
        # Never invoked, nothing measured: the autoscaler asks for zero, the spec's minimum keeps two.
        assert re.search(
            rf"^  {spec['gpuSpecificationId']}: 2 instance\(s\) since .*scale to zero; minInstances keep 2$", why, re.M
        ), why

        # A spec no cluster has room for (the whole node, two of whose GPUs are taken) waits, and deploy
        # get says why.
        other = json.loads(
            ok(await cli("function", "create", "--input-file", _write(tmp_path), "--json", *conn, env=env))
        )
        node = ["--gpu", "H100", "--instance-type", "ON-PREM.GPU.H100_8x"]
        ok(await cli("deploy", "create", other["function"]["id"], *node, "--no-wait", *conn, env=env))

        async def said_why() -> str | None:
            shown = ok(await cli("deploy", "get", other["function"]["id"], *conn, env=env))
            return shown if "waiting (why):" in shown else None

        waiting = await wait_for(said_why, timeout=15, what="the waiting reason in deploy get")
        assert re.search(
            r"^waiting \(why\):\n  \S+: 1 instance\(s\) wait for capacity: no matching cluster has room for "
            r"another ON-PREM\.GPU\.H100_8x$",
            waiting,
            re.M,
        ), waiting

        scaled = json.loads(ok(await cli("deploy", "update", fid, "--max-instances", "4", "--json", *conn, env=env)))
        assert scaled["gpuSpecification"]["maxInstances"] == 4
        assert scaled["gpuSpecification"]["minInstances"] == 2
        refused = await cli("deploy", "update", fid, vid, "--min-instances", "5", *conn, env=env)
        assert refused.returncode == 1
        assert (
            refused.stderr.strip()
            == "nvcf-mono: HTTP 400: 'minInstances' must be lesser than or equal to 'maxInstances'"
        )
        wrong_spec = await cli(
            "deploy", "update", fid, vid, "--spec-id", "nope", "--min-instances", "1", *conn, env=env
        )
        assert wrong_spec.returncode == 1 and "HTTP 404" in wrong_spec.stderr
        nothing = await cli("deploy", "update", fid, vid, *conn, env=env)
        assert nothing.returncode == 2
        assert nothing.stderr.strip() == (
            "nvcf-mono: deploy update: give --min-instances, --max-instances, --autoscaling-policy and/or "
            "--autoscaling-file"
        )
        # A spec's own autoscaling policy, from a file; the PATCH answers with it.
        policy = tmp_path / "autoscaling.json"
        policy.write_text(
            json.dumps(
                {
                    "scaleUpDetails": {
                        "factor": 2.0,
                        "threshold": 60,
                        "stickiness": {"size": "PT3M", "threshold": "PT2M"},
                    },
                    "scaleDownDetails": {"factor": 0.5, "threshold": 20},
                }
            )
        )
        custom = json.loads(
            ok(await cli("deploy", "update", fid, vid, "--autoscaling-file", str(policy), "--json", *conn, env=env))
        )
        assert custom["gpuSpecification"]["autoscalingConfiguration"]["scaleUpDetails"]["factor"] == 2.0
        back = json.loads(
            ok(
                await cli(
                    "deploy",
                    "update",
                    fid,
                    vid,
                    "--autoscaling-policy",
                    "PLATFORM_CONFIGURATION",
                    "--json",
                    *conn,
                    env=env,
                )
            )
        )
        assert "autoscalingConfiguration" not in back["gpuSpecification"]

        again = await cli("deploy", "create", fid, vid, *H100, *conn, env=env)
        assert again.returncode == 1
        assert "HTTP 400: Function version is already deployed" in again.stderr
        second = json.loads(
            ok(
                await cli(
                    "function",
                    "create",
                    "--function-id",
                    fid,
                    "--input-file",
                    _write(tmp_path),
                    "--json",
                    *conn,
                    env=env,
                )
            )
        )["function"]["versionId"]
        which = await cli("deploy", "get", fid, *conn, env=env)  # two versions: the command cannot guess
        assert which.returncode == 2
        assert which.stderr.strip() == (
            f"nvcf-mono: function {fid} has 2 versions; name one after the function id: "
            + ", ".join(sorted([vid, second]))
        )

        removed = ok(await cli("deploy", "remove", fid, vid, *conn, env=env))
        assert removed.strip() == f"removed the deployment of function {fid} version {vid}; status INACTIVE"
        state = (await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}")).json["function"]
        assert state["status"] == "INACTIVE"
        assert (await p.admin.get(f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}")).status == 404

        # --no-wait returns at once with the accepted deployment.
        quick = json.loads(ok(await cli("deploy", "create", fid, vid, *H100, "--no-wait", "--json", *conn, env=env)))
        assert quick["deployment"]["functionStatus"] == "DEPLOYING"


@pytest.mark.slow
async def test_failing_deployment_exits_1_with_the_error(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus, behaviour="fail-permanent"):
        # Credentials from the state directory named in the environment.
        env = env_for(tmp_path, NVCF_MONO_STATE_DIR=str(p.host.settings.state_dir))
        fn = json.loads(ok(await cli("function", "create", "--input-file", _write(tmp_path), "--json", env=env)))
        fid, vid = fn["function"]["id"], fn["function"]["versionId"]
        failed = await cli("deploy", "create", fid, vid, *H100, env=env)
        assert failed.returncode == 1, failed.stderr
        assert failed.stdout == ""
        lines = failed.stderr.splitlines()
        errors = [ln for ln in lines if ln.startswith("nvcf-mono: ")]
        assert errors[0] == f"nvcf-mono: deployment of function {fid} version {vid} failed: status ERROR"
        assert any("H100 ON-PREM.GPU.H100_1x on local: " in ln and "image 'nope' not found" in ln for ln in errors)
        assert errors[-1] == f"nvcf-mono: Remove it before deploying again: nvcf-mono deploy remove {fid} {vid}"
        assert any(ln.startswith("[") and "DEPLOYING" in ln for ln in lines)  # progress came first

        shown = ok(await cli("deploy", "get", fid, vid, env=env))
        assert kv(shown)["status"] == "ERROR"
        assert "image 'nope' not found" in shown
        ok(await cli("deploy", "undeploy", fid, vid, env=env))
        assert (await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid}")).json["function"]["status"] == "INACTIVE"


@pytest.mark.slow
async def test_deploy_timeout_exits_1_and_says_what_it_saw(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p, agent(p.bus, behaviour="start"):
        conn = flags(p)
        fn = json.loads(ok(await cli("function", "create", "--input-file", _write(tmp_path), "--json", *conn, env=env)))
        fid, vid = fn["function"]["id"], fn["function"]["versionId"]
        slow = await cli("deploy", "create", fid, vid, *H100, "--timeout", "2", *conn, env=env)
        assert slow.returncode == 1
        assert (
            "nvcf-mono: timed out after 2s waiting for ACTIVE; last seen: DEPLOYING  H100 ON-PREM.GPU.H100_1x: 0/1 "
            "running, 1 starting" in slow.stderr
        ), slow.stderr
        assert f"nvcf-mono deploy remove {fid} {vid}" in slow.stderr


_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
)


@pytest.mark.e2e
async def test_ctrl_c_stops_waiting_and_leaves_the_deployment(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p, agent(p.bus, behaviour="start"):
        conn = flags(p)
        fn = json.loads(ok(await cli("function", "create", "--input-file", _write(tmp_path), "--json", *conn, env=env)))
        fid, vid = fn["function"]["id"], fn["function"]["versionId"]
        err = tmp_path / "deploy.stderr"
        with err.open("w") as sink:
            # A terminal's Ctrl-C, even when this suite runs as a background job: such a job starts with
            # SIGINT ignored, which Python (rightly) keeps, so the CLI is started with it at its default.
            command = [sys.executable, "-m", "nvcf_mono", "deploy", "create", fid, vid, *H100, *conn]
            async with await anyio.open_process(
                [sys.executable, "-c", _WITH_DEFAULT_SIGINT, *command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env=env,
                cwd=ROOT,
            ) as proc:

                async def waiting() -> bool:
                    return "DEPLOYING" in err.read_text()

                try:
                    await wait_for(waiting, timeout=30, what="the progress line")
                    proc.send_signal(signal.SIGINT)
                    with anyio.move_on_after(30):
                        code = await proc.wait()
                    assert proc.returncode is not None, f"{describe(proc.pid)}; stderr: {err.read_text()!r}"
                finally:
                    if proc.returncode is None:  # the test failed midway: do not wait out its 900 s
                        proc.kill()
        assert code == 130
        assert err.read_text().splitlines()[-1] == "stopped waiting; the deployment goes on"
        dep = await p.admin.get(f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}")
        assert dep.status == 200 and dep.json["deployment"]["functionStatus"] == "DEPLOYING"


async def test_errors_and_credential_choice(tmp_path: Path, dead: str) -> None:
    env = env_for(tmp_path)
    refused = await cli("function", "list", "--api-url", dead, "--token", "t", env=env)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"nvcf-mono: cannot connect to the API at {dead} (from --api-url): connection refused.",
        "nvcf-mono: Is the platform running? Start it with `make up` or `nvcf-mono up`.",
    ]
    nothing = await cli("function", "list", env=env)
    assert nothing.returncode == 2
    assert "no API URL: pass --api-url, set NVCF_API_URL, or start the platform with `nvcf-mono up`" in nothing.stderr
    no_creds = await cli("function", "list", "--api-url", dead, env=env)
    assert no_creds.returncode == 2
    assert no_creds.stderr.strip() == (
        f"nvcf-mono: no credentials for {dead}: pass --token (or --api-key), set NVCF_TOKEN (or NVCF_API_KEY), "
        "or point --state-dir at a platform started with `nvcf-mono up` (its endpoints.json holds the credentials)"
    )
    not_a_url = await cli("function", "list", "--api-url", "localhost:8080", "--token", "t", env=env)
    assert not_a_url.returncode == 2 and "expected an http:// or https:// URL" in not_a_url.stderr

    # Usage errors: argparse (exit 2) and values checked before any call.
    assert (await cli("deploy", "create", "only-one-id", env=env)).returncode == 2
    negative = await cli("deploy", "create", "f", "v", *H100, "--min-instances", "-1", env=env)
    assert negative.returncode == 2 and "must not be negative" in negative.stderr
    no_eq = await cli("function", "create", "--name", "n", "--inference-url", "/x", "--container-env", "FOO", env=env)
    assert no_eq.returncode == 2
    assert no_eq.stderr.strip() == "nvcf-mono: --container-env 'FOO': expected KEY=VALUE"
    both = await cli("function", "create", "--image", "i", "--helm-chart", "c", env=env)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    bare = await cli("function", env=env)
    assert bare.returncode == 2 and "create" in bare.stdout

    async with platform(tmp_path) as p:
        url = p.host.endpoints.url
        creds = credentials(p.host)
        bad = await cli("function", "list", "--api-url", url, "--token", "not-a-token", env=env)
        assert bad.returncode == 1
        assert bad.stderr.splitlines()[0].startswith("nvcf-mono: HTTP 401: ")
        assert bad.stderr.splitlines()[1] == f"nvcf-mono: The token from --token was not accepted by {url}."

        missing = await cli("function", "get", "00000000-0000-4000-8000-000000000000", "--api-url", url, "--token",
                            creds["admin_token"], env=env)  # fmt: skip
        assert missing.returncode == 1
        assert missing.stderr.startswith("nvcf-mono: HTTP 404: ")

        # The API key (from the environment) reads; management with it gets 403 and a hint.
        key_env = env_for(tmp_path, NVCF_API_URL=url, NVCF_API_KEY=creds["api_key"])
        assert json.loads(ok(await cli("function", "list", "--json", env=key_env))) == {"functions": []}
        forbidden = await cli("function", "create", "--input-file", _write(tmp_path), env=key_env)
        assert forbidden.returncode == 1
        assert forbidden.stderr.splitlines()[0].startswith("nvcf-mono: HTTP 403: ")
        assert "management commands need a token" in forbidden.stderr
        # An explicit --api-key is used even when the environment has a token.
        both_env = env_for(tmp_path, NVCF_API_URL=url, NVCF_TOKEN=creds["admin_token"])
        explicit = await cli("function", "create", "--input-file", _write(tmp_path), "--api-key", creds["api_key"],
                             env=both_env)  # fmt: skip
        assert explicit.returncode == 1 and explicit.stderr.startswith("nvcf-mono: HTTP 403: ")

        # A platform's credentials are never sent to another URL.
        elsewhere = await cli("function", "list", "--state-dir", str(p.host.settings.state_dir), "--api-url", dead,
                              env=env)  # fmt: skip
        assert elsewhere.returncode == 2
        assert f"is for {url}, not {dead}" in elsewhere.stderr


async def test_api_key_commands(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p:
        conn = flags(p)
        url = p.host.endpoints.url
        fn = (await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).json["function"]

        made = await cli("api-key", "generate", "--description", "ci key", *conn, env=env)
        fields = kv(ok(made))
        key, key_id = fields["key"], fields["id"]
        assert key.startswith("nvapi-")
        assert fields["scopes"] == "invoke_function, list_functions, queue_details, list_functions_details"
        assert fields["resources"] == "account-functions:*, authorized-functions:*"
        assert "Save the key now: it is not shown again" in made.stderr
        listed = json.loads(ok(await cli("function", "list", "--json", "--api-url", url, "--api-key", key, env=env)))
        assert [f["id"] for f in listed["functions"]] == [fn["id"]]

        keys = ok(await cli("api-key", "list", *conn, env=env))
        assert key_id in keys and key not in keys  # the value is never listed
        assert key_id in {
            k["id"] for k in json.loads(ok(await cli("api-key", "list", "--json", *conn, env=env)))["keys"]
        }

        narrow = json.loads(
            ok(
                await cli(
                    "api-key", "generate", "--scopes", "list_functions", "--resources",
                    f"function:{fn['id']}/{fn['versionId']}", "--expires-in", "1h", "--json", *conn, env=env,
                )
            )
        )  # fmt: skip
        policy = narrow["authorizations"]["policies"][0]
        assert policy["scopes"] == ["list_functions"]
        assert policy["resources"] == [{"id": f"{fn['id']}/{fn['versionId']}", "type": "function"}]
        other = (await p.admin.post("/v2/nvcf/functions", {**CONTAINER_FUNCTION, "name": "other"})).json["function"]
        seen = await cli(
            "function", "get", fn["id"], fn["versionId"], "--api-url", url, "--api-key", narrow["value"], env=env
        )
        ok(seen)
        hidden = await cli("function", "get", other["id"], other["versionId"], "--api-url", url, "--api-key",
                           narrow["value"], env=env)  # fmt: skip
        assert hidden.returncode == 1 and re.match(r"nvcf-mono: HTTP 40[34]: ", hidden.stderr)

        task = json.loads(ok(await cli("api-key", "generate", "--for", "task", "--json", *conn, env=env)))
        assert task["value"].startswith("nvapi-")

        revoked = ok(await cli("api-key", "revoke", key_id, *conn, env=env))
        assert revoked.strip() == f"revoked API key {key_id}"
        after = await cli("function", "list", "--api-url", url, "--api-key", key, env=env)
        assert after.returncode == 1 and after.stderr.startswith("nvcf-mono: HTTP 401: ")

        delegated = kv(ok(await cli("api-key", "delegate", fn["id"], "--client-id", "partner", *conn, env=env)))
        assert delegated["expires in"] == "3600s" and delegated["token"].startswith("nvcft_")
        # A bearer for invoking that function only: listing functions is not among what it may do.
        refused = await cli("function", "list", "--api-url", url, "--token", delegated["token"], env=env)
        assert refused.returncode == 1 and refused.stderr.startswith("nvcf-mono: HTTP 403: "), refused.stderr
        pinned = f"{fn['id']}:{fn['versionId']}"
        as_json = json.loads(ok(await cli("api-key", "delegate", pinned, "--client-id", "p", "--json", *conn, env=env)))
        assert set(as_json) == {"access_token", "expires_in"}
        five = await cli("api-key", "delegate", *[fn["id"]] * 5, "--client-id", "p", *conn, env=env)
        assert five.returncode == 2 and "at most 4 functions" in five.stderr
        spaced = await cli("api-key", "delegate", fn["id"], "--client-id", "a b", *conn, env=env)
        assert spaced.returncode == 1 and "clientId" in spaced.stderr

        bad = await cli("api-key", "generate", "--expires-in", "soon", *conn, env=env)
        assert bad.returncode == 2 and "expected a duration such as 24h" in bad.stderr
        bad_res = await cli("api-key", "generate", "--resources", "everything", *conn, env=env)
        assert bad_res.returncode == 2 and "expected TYPE:ID" in bad_res.stderr


async def test_cluster_commands(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p, agent(p.bus) as fake:
        conn = flags(p)
        shown = ok(await cli("cluster", "list", *conn, env=env))
        header, *rows = shown.splitlines()
        assert header.split() == ["NAME", "CLUSTER", "ID", "GROUP", "REGION", "STATUS", "GPUS"]
        assert len(rows) == 1
        assert re.match(r"^local\s+6b1e4d3a-58a1-4a5e-9d58-2a1c0f000001\s+local\s+us-west-1\s+healthy\s+H100 ", rows[0])
        # A cordoned cluster (its agent stopping) is healthy and takes nothing new: it once read "unhealthy".
        fake.maintenance = MaintenanceMode.CORDON_ONLY
        await fake.heartbeat()
        shown = ok(await cli("cluster", "list", *conn, env=env))
        assert re.search(r"\sus-west-1\s+healthy \(cordoned\)\s+H100 \d+/\d+ free", shown), shown
        (listed,) = json.loads(ok(await cli("cluster", "list", "--json", *conn, env=env)))["clusters"]
        assert (listed["status"], listed["maintenanceMode"]) == ("healthy", "CordonOnly")
        fake.maintenance = MaintenanceMode.NONE
        await fake.heartbeat()
        doc = json.loads(ok(await cli("cluster", "list", "--json", *conn, env=env)))
        clusters = doc["clusters"] if isinstance(doc, dict) else doc
        assert [c["clusterName"] for c in clusters] == ["local"]
        other = await cli("cluster", "list", "--account", "someone-else", *conn, env=env)
        if other.returncode == 0:
            assert other.stdout.strip() == "no clusters in account someone-else"
        else:
            assert other.returncode == 1 and re.match(r"nvcf-mono: HTTP 40[34]: ", other.stderr), other.stderr

        groups = ok(await cli("cluster", "groups", *conn, env=env))
        assert re.search(r"^local\s+\S+\s+local\s+H100\s+ON-PREM\.GPU\.H100_1x", groups, re.M), groups
        gdoc = json.loads(ok(await cli("cluster", "groups", "--json", *conn, env=env)))
        assert [g["name"] for g in gdoc["clusterGroups"]] == ["local"]


def _write(tmp_path: Path) -> str:
    path = tmp_path / "function.json"
    path.write_text(json.dumps(CONTAINER_FUNCTION))
    return str(path)


async def test_account_secret_commands(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p:
        conn = flags(p)
        assert ok(await cli("account-secret", "list", *conn, env=env)).strip() == "no account secrets"
        value_file = tmp_path / "token.txt"
        value_file.write_text("from-a-file\n")
        made = await cli("account-secret", "set", "region=eu", f"token=@{value_file}", *conn, env=env)
        assert ok(made).strip() == "set region, token"
        assert ok(await cli("account-secret", "list", *conn, env=env)).split() == ["region", "token"]
        assert json.loads(ok(await cli("account-secret", "list", "--json", *conn, env=env))) == {
            "secrets": ["region", "token"]
        }
        # Stored sealed, and an instance of the account reads the values as given (the file's without its newline).
        sealed = await p.bus.kv("nvcf_secrets").get("acct.nvcf-default")
        assert sealed is not None and b"from-a-file" not in sealed.value
        fn = (await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).json["function"]
        assert await fetch(p, worker_token(p, fn["id"], fn["versionId"])) == {"region": "eu", "token": "from-a-file"}
        assert ok(await cli("account-secret", "delete", "region", *conn, env=env)).strip() == "deleted region"
        assert ok(await cli("account-secret", "list", *conn, env=env)).split() == ["token"]

        # A super admin manages another account's; errors are one line and a non-zero exit.
        await p.admin.post("/v2/nvcf/accounts/acct-b", {"name": "acct-b"})
        ok(await cli("account-secret", "set", "b=1", "--account", "acct-b", *conn, env=env))
        assert ok(await cli("account-secret", "list", "--account", "acct-b", *conn, env=env)).split() == ["b"]
        missing = await cli("account-secret", "delete", "nope", *conn, env=env)
        assert missing.returncode == 1 and "no secret named 'nope'" in missing.stderr
        usage = await cli("account-secret", "set", "no-equals-sign", *conn, env=env)
        assert usage.returncode == 2 and "expected KEY=VALUE" in usage.stderr
        unreadable = await cli("account-secret", "set", f"x=@{tmp_path / 'absent'}", *conn, env=env)
        assert unreadable.returncode == 2 and "cannot read" in unreadable.stderr
        (tmp_path / "binary").write_bytes(b"\xff\xfe")
        binary = await cli("account-secret", "set", f"x=@{tmp_path / 'binary'}", *conn, env=env)
        assert binary.returncode == 2 and "is not UTF-8 text" in binary.stderr
        assert "Traceback" not in missing.stderr + usage.stderr + unreadable.stderr + binary.stderr
        piped = await cli("account-secret", "set", "piped=@-", *conn, env=env, stdin=b"from-a-pipe\n")
        assert ok(piped).strip() == "set piped"
        assert (await fetch(p, worker_token(p, fn["id"], fn["versionId"])))["piped"] == "from-a-pipe"
        # Standard input is read once: a second @- would have set its secret to "" without a word.
        twice = await cli("account-secret", "set", "a=@-", "b=@-", *conn, env=env, stdin=b"one\n")
        assert twice.returncode == 2 and "standard input can be read once" in twice.stderr, twice.stderr
        assert not {"a", "b"} & set(await fetch(p, worker_token(p, fn["id"], fn["versionId"])))  # nothing was set


async def test_registry_credential_commands(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p:
        conn = flags(p)
        rc = ("registry-credential",)
        assert ok(await cli(*rc, "list", *conn, env=env)).strip() == "no registry credentials"
        key_file = tmp_path / "ngc.key"
        key_file.write_text("nvapi-KEY-0001\n")
        made = await cli(
            *rc, "add", "--hostname", "nvcr.io", "--username", "$oauthtoken", "--password-file", str(key_file),
            "--artifact-type", "container", "--tag", "team-a", *conn, env=env,
        )  # fmt: skip
        shown = kv(ok(made))
        cid = shown["id"]
        assert shown["hostname"] == "nvcr.io" and shown["artifact types"] == "CONTAINER"
        assert shown["name"] == "nvcr.io" and shown["tags"] == "team-a"
        # What the platform stored is base64 of user:password (the file's newline dropped), never shown.
        key = buckets.account_item_key("nvcf-default", cid)
        expected = base64.b64encode(b"$oauthtoken:nvapi-KEY-0001").decode()
        assert await opened_secret(p, "registry_credentials", key) == expected

        listing = ok(await cli(*rc, "list", *conn, env=env))
        assert re.search(rf"^{cid}\s+nvcr\.io\s+CONTAINER\s+nvcr\.io\s+USER", listing, re.M), listing
        assert (
            ok(await cli(*rc, "list", "--artifact-type", "HELM", *conn, env=env)).strip() == "no registry credentials"
        )
        # Types are added, never removed; a new secret keeps the name.
        updated = await cli(
            *rc,
            "update",
            cid,
            "--artifact-type",
            "HELM",
            "--username",
            "$oauthtoken",
            "--password",
            "nvapi-KEY-2",
            *conn,
            env=env,
        )
        assert kv(ok(updated))["artifact types"] == "CONTAINER, HELM" and kv(updated.stdout)["name"] == "nvcr.io"
        doc = json.loads(ok(await cli(*rc, "get", cid, "--json", *conn, env=env)))
        assert doc["registryCredential"]["artifactTypes"] == ["CONTAINER", "HELM"]
        assert "secret" not in json.dumps(doc).lower().replace("registrycredential", "")
        recognized = ok(await cli(*rc, "list-recognized", *conn, env=env))
        assert re.search(r"^CONTAINER\s+\S.*\s+nvcr\.io$", recognized, re.M), recognized

        # Mistakes are one line and exit 2 before any call; the platform's refusals exit 1.
        usage = [
            await cli(*rc, "add", "--hostname", "x.io", "--artifact-type", "HELM", *conn, env=env),
            await cli(*rc, "add", "--hostname", "x.io", "--artifact-type", "HELM", "--username", "u", *conn, env=env),
            await cli(*rc, "add", "--hostname", "x.io", "--artifact-type", "HELM", "--password", "p", *conn, env=env),
            await cli(*rc, "update", cid, *conn, env=env),
        ]
        assert [u.returncode for u in usage] == [2, 2, 2, 2], [u.stderr for u in usage]
        again = await cli(
            *rc,
            "add",
            "--hostname",
            "NVCR.io",
            "--secret",
            "JG9hdXRodG9rZW46bnZhcGktS0VZLTM=",
            "--artifact-type",
            "HELM",
            *conn,
            env=env,
        )
        assert again.returncode == 1 and "already exists" in again.stderr, again.stderr
        assert ok(await cli(*rc, "delete", cid, *conn, env=env)).strip() == f"deleted {cid}"
        gone = await cli(*rc, "get", cid, *conn, env=env)
        assert gone.returncode == 1 and "not found" in gone.stderr
        assert "Traceback" not in "".join(u.stderr for u in [*usage, again, gone])


async def test_telemetry_commands(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p:
        conn = flags(p)
        assert ok(await cli("telemetry", "list", *conn, env=env)).strip() == "no telemetry endpoints"
        made = await cli(
            "telemetry", "add", "--name", "collector", "--endpoint", "https://otel.example.com:4318",
            "--secret-file", "-", *conn, env=env, stdin=b"bearer-TOKEN-0001\n",
        )  # fmt: skip
        shown = kv(ok(made))
        tid = shown["id"]
        assert shown["types"] == "LOGS, METRICS, TRACES" and shown["provider"] == "OTEL_COLLECTOR"
        grafana = await cli(
            "telemetry", "add", "--name", "grafana", "--endpoint", "https://otlp-gateway.example.net/otlp",
            "--provider", "grafana_cloud", "--instance-id", "123456", "--secret", "glc-KEY", "--type", "metrics",
            *conn, env=env,
        )  # fmt: skip
        assert kv(ok(grafana))["types"] == "METRICS"
        listing = ok(await cli("telemetry", "list", *conn, env=env))
        assert re.search(rf"^{tid}\s+collector\s+OTEL_COLLECTOR\s+LOGS, METRICS, TRACES\s+https://otel", listing, re.M)

        # A function picks it by id with the flags that already exist; then it cannot be deleted.
        fn = await cli(
            "function", "create", "--name", "echo", "--image", "echo", "--inference-url", "/echo",
            "--inference-port", "8000", "--traces-telemetry-id", tid, *conn, env=env,
        )  # fmt: skip
        ok(fn)
        busy = await cli("telemetry", "delete", tid, *conn, env=env)
        assert busy.returncode == 1 and "in use by Function id" in busy.stderr, busy.stderr

        sealed_before = await sealed_of(p, "telemetries", buckets.account_item_key("nvcf-default", tid))
        replaced = await cli("telemetry", "set-secret", tid, "--secret", "bearer-TOKEN-0002", *conn, env=env)
        assert ok(replaced).strip() == f"replaced the secret of collector ({tid})"
        key = buckets.account_item_key("nvcf-default", tid)
        assert json.loads(await opened_secret(p, "telemetries", key, not_before=sealed_before)) == "bearer-TOKEN-0002"

        usage = [
            await cli("telemetry", "add", "--name", "x", "--endpoint", "https://o.example.com", *conn, env=env),
            await cli(
                "telemetry",
                "add",
                "--name",
                "x",
                "--endpoint",
                "https://o.example.com",
                "--secret",
                "k",
                "--provider",
                "GRAFANA_CLOUD",
                *conn,
                env=env,
            ),
            await cli(
                "telemetry",
                "add",
                "--name",
                "x",
                "--endpoint",
                "https://o.example.com",
                "--type",
                "EVENTS",
                "--secret",
                "k",
                *conn,
                env=env,
            ),
        ]
        assert [u.returncode for u in usage] == [2, 2, 2], [u.stderr for u in usage]
        # The platform's own refusal (a loopback endpoint) is its problem's detail, exit 1.
        local = await cli("telemetry", "add", "--name", "y", "--endpoint", "http://127.0.0.1:4318", "--secret", "k",
                          *conn, env=env)  # fmt: skip
        assert local.returncode == 1 and "127.0.0.1 is a loopback address" in local.stderr, local.stderr
        assert "Traceback" not in "".join(u.stderr for u in [*usage, busy, local])


async def sealed_of(p: Platform, table: str, key: str) -> str | None:
    """What the control plane stored sealed for ``key`` in ``table`` (read through a mirror of the store)."""
    async with control_store(p) as store:

        async def found() -> str | None:
            stored = getattr(store, table).get(key)
            return None if stored is None else str(stored.sealed_secret)

        return await wait_for(found, what=f"{key} in {table}")  # type: ignore[no-any-return]


async def opened_secret(p: Platform, table: str, key: str, *, not_before: str | None = None) -> str:
    """The secret stored for ``key``, opened with the platform's key (a newer one than ``not_before``)."""

    async def changed() -> str | None:
        sealed = await sealed_of(p, table, key)
        return sealed if sealed != not_before else None

    sealed = await wait_for(changed, what=f"a new secret for {key}")
    return str(p.host.services.get(KEYRING).box.open(sealed, aad=key).decode())


async def test_function_queue_commands(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    async with platform(tmp_path) as p:
        conn = flags(p)
        fid, vid = await new_function(p)
        idle = ok(await cli("function", "queue", "status", fid, *conn, env=env))
        assert re.search(rf"^{vid}\s+echo\s+INACTIVE\s+0\s+-$", idle, re.M), idle
        ids = await enqueue(p, await request_stream(p, vid), fid, vid, 3)
        waiting = ok(await cli("function", "queue", "status", fid, vid, *conn, env=env))
        assert re.search(rf"^{vid}\s+echo\s+INACTIVE\s+3\s+", waiting, re.M), waiting
        third = ok(await cli("function", "queue", "position", ids[2], *conn, env=env))
        assert third.strip() == f"position 3 (1 is next) for function {fid} version {vid}"
        doc = json.loads(ok(await cli("function", "queue", "position", ids[0], "--json", *conn, env=env)))
        assert doc == {"functionId": fid, "functionVersionId": vid, "positionInQueue": 1}
        unknown = await cli("function", "queue", "position", "00000000-0000-4000-8000-000000000000", *conn, env=env)
        assert unknown.returncode == 1 and "is not queued" in unknown.stderr, unknown.stderr
        missing = await cli("function", "queue", "status", "00000000-0000-4000-8000-000000000000", *conn, env=env)
        assert missing.returncode == 1 and "Traceback" not in missing.stderr + unknown.stderr
