"""TLS on the platform's listeners: HTTPS and gRPC, workers dialling over TLS, certificates reloaded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import threading
from pathlib import Path

import aiohttp
import anyio
import anyio.abc
import attrs
import pytest
from anyio.streams.tls import TLSAttribute, TLSStream
from cryptography import x509
from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from nvcf_mono.config.load import ConfigError
from nvcf_mono.host import Host, HostFailed
from nvcf_mono.state_dir import ENDPOINTS_FILE
from nvcf_mono.testing.host import running_host
from nvcf_mono.testing.platform import Api, platform_config, wait_for, wait_status
from nvcf_mono.testing.running import ECHO_FUNCTION
from nvcf_mono.tls import ServerTls, development_certificate
from tests.e2e.cli import run_cli
from tests.integration.compute.conftest import FAST, cluster, spec

pytestmark = pytest.mark.slow


def trusting(ca: Path, alpn: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if alpn:
        context.set_alpn_protocols([alpn])
    return context


async def serial_served(host: str, port: int, context: ssl.SSLContext) -> int:
    """The serial number of the certificate a new connection is shown."""
    stream = await anyio.connect_tcp(host, port, ssl_context=context, tls_hostname=host, tls_standard_compatible=False)
    async with stream:
        der = stream.extra(TLSAttribute.peer_certificate_binary)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


async def test_https_grpc_and_workers_over_tls_and_a_new_certificate_without_a_restart(tmp_path: Path) -> None:
    settings = {**FAST, "tls.self_signed": "true", "tls.reload_interval": "0.2"}
    settings["plugins.compute.clusters"] = json.dumps([cluster("local", "6b1e4d3a-58a1-4a5e-9d58-2a1c0f0000f1")])
    async with running_host(platform_config(tmp_path / "state", settings=settings)) as host:
        doc = json.loads((host.settings.state_dir / ENDPOINTS_FILE).read_text())
        assert doc["api_url"].startswith("https://") and doc["grpc_tls"] is True
        ca = Path(doc["ca_file"])
        assert ca == host.settings.state_dir / "tls" / "ca.pem"
        port = int(doc["api_url"].rsplit(":", 1)[1])

        # HTTPS trusting the CA; no plaintext, and no trust without the CA.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(ca))) as session:
            async with session.get(f"{doc['api_url']}/health") as resp:
                assert resp.status == 200
            for url, fails in ((f"http://127.0.0.1:{port}/health", aiohttp.ClientError),):
                with pytest.raises(fails):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        await resp.read()
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await plain.get(f"{doc['api_url']}/health")

            # gRPC over TLS (ALPN h2), as NVCF's clients dial it once they hold a token.
            host_name, _, grpc_port = doc["grpc_url"].rpartition(":")
            channel = Channel(host_name, int(grpc_port), ssl=trusting(ca, "h2"))
            try:
                with anyio.fail_after(10):
                    reply = await HealthStub(channel).Check(HealthCheckRequest())
                assert reply.status == HealthCheckResponse.SERVING
            finally:
                channel.close()

            # The platform's own workers dial its gRPC port over TLS: an instance serves a call.
            api = Api(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting(ca))),
                doc["api_url"],
                doc["credentials"]["admin_token"],
            )
            async with api.session:
                made = await api.post("/v2/nvcf/functions", ECHO_FUNCTION)
                fid, vid = made.json["function"]["id"], made.json["function"]["versionId"]
                d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
                assert (await api.post(d, {"deploymentSpecifications": [spec()]})).status == 200
                await wait_status(api, d, "ACTIVE", timeout=60)
                answer = await api.as_(doc["credentials"]["api_key"]).post(
                    f"/v2/nvcf/pexec/functions/{fid}", {"message": "tls"}
                )
                assert answer.status == 200 and answer.json["message"] == "tls", answer.body

        # A renewed certificate (here: another CA's) is served to the next connection, without a restart.
        before = await serial_served("127.0.0.1", port, trusting(ca))
        renewed = development_certificate(tmp_path / "renewed")
        served = host.settings.state_dir / "tls"
        shutil.copy(renewed.key, served / "key.pem")
        shutil.copy(renewed.cert, served / "cert.pem")
        new_serial = x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number
        assert renewed.ca is not None

        async def renewed_served() -> bool:
            try:
                return await serial_served("127.0.0.1", port, trusting(renewed.ca)) == new_serial  # type: ignore[arg-type]
            except ssl.SSLCertVerificationError:
                return False  # still the first certificate, which the new CA did not sign

        await wait_for(renewed_served, timeout=10, what="the renewed certificate served")
        assert before != new_serial


async def test_the_cli_trusts_a_platform_started_with_a_relative_state_dir_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make up ARGS=--tls`` keeps its state in ``.nvcf-mono``; the CLI run elsewhere with ``--state-dir``
    must find the CA that endpoints.json names (it once named it relative to the platform's directory)."""
    monkeypatch.chdir(tmp_path)
    async with running_host(platform_config(Path(".nvcf-mono"), settings={"tls.self_signed": "true"})):
        doc = json.loads((tmp_path / ".nvcf-mono" / ENDPOINTS_FILE).read_text())
        assert doc["ca_file"] == str(tmp_path / ".nvcf-mono" / "tls" / "ca.pem")
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        state = str(tmp_path / ".nvcf-mono")
        listed = await anyio.to_thread.run_sync(lambda: run_cli("function", "list", "--state-dir", state, env={}))
        assert listed.returncode == 0, listed.stderr
        assert "Traceback" not in listed.stderr


async def test_bad_tls_settings_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        platform_config(tmp_path / "a", settings={"tls.cert_file": str(tmp_path / "c.pem")})
    assert "cert_file and key_file must be given together" in str(err.value)
    with pytest.raises(ConfigError) as err:
        platform_config(
            tmp_path / "b",
            settings={"tls.self_signed": "true", "tls.cert_file": "/x.pem", "tls.key_file": "/y.pem"},
        )
    assert "self_signed" in str(err.value)

    # A certificate that is not one stops the host with one clear line, before anything listens.
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    bad = platform_config(
        tmp_path / "c",
        settings={"tls.cert_file": str(tmp_path / "cert.pem"), "tls.key_file": str(tmp_path / "key.pem")},
    )
    with pytest.raises(HostFailed) as failed:
        await Host(bad).serve()
    assert f"cannot use the certificate {tmp_path / 'cert.pem'}" in str(failed.value)


def test_a_development_certificate_is_kept_and_covers_the_names_asked(tmp_path: Path) -> None:
    first = development_certificate(tmp_path, ["api.example.test", "10.1.2.3"])
    made = first.cert.read_bytes()
    again = development_certificate(tmp_path, ["api.example.test"])
    assert again == first and again.cert.read_bytes() == made  # reused, not made again
    cert = x509.load_pem_x509_certificate(first.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "api.example.test"} <= set(names.get_values_for_type(x509.DNSName))
    assert {"127.0.0.1", "10.1.2.3"} <= {str(a) for a in names.get_values_for_type(x509.IPAddress)}
    assert oct(first.key.stat().st_mode & 0o777) == "0o600"
    # A name it does not cover makes a new one.
    other = development_certificate(tmp_path, ["other.example.test"])
    assert other.cert.read_bytes() != made


def test_a_pair_that_does_not_load_keeps_the_old_one_and_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = development_certificate(tmp_path / "a")
    served = ServerTls(files)
    good = files.cert.read_bytes()
    files.cert.write_text("not a certificate")
    assert served.reload_if_changed() is False
    assert served.reload_if_changed() is False  # the same broken files: not tried (nor logged) again
    assert len([r for r in caplog.records if "still serving the previous certificate" in r.message]) == 1
    renewed = development_certificate(tmp_path / "b")
    shutil.copy(renewed.key, files.key)
    files.cert.write_bytes(renewed.cert.read_bytes())
    assert served.reload_if_changed() is True
    assert files.cert.read_bytes() != good


async def test_handshakes_made_while_a_certificate_is_renewed_all_succeed(tmp_path: Path) -> None:
    """Renewal loaded the new pair into the contexts in use: a handshake between the certificate and
    the key took the new certificate with the old key and was cut off (EndOfStream at the client).
    """
    pairs = [development_certificate(tmp_path / name) for name in ("a", "b")]
    served_dir = tmp_path / "served"
    served_dir.mkdir()
    files = attrs.evolve(pairs[0], cert=served_dir / "cert.pem", key=served_dir / "key.pem")
    shutil.copy(pairs[0].cert, files.cert)
    shutil.copy(pairs[0].key, files.key)
    served = ServerTls(files)
    trust = ssl.create_default_context()
    for pair in pairs:
        assert pair.ca is not None
        trust.load_verify_locations(cafile=str(pair.ca))
    failures: list[BaseException] = []
    handshakes = 0

    async def serve(client: anyio.abc.SocketStream) -> None:
        async with client:
            with contextlib.suppress(Exception):
                wrapped = await TLSStream.wrap(
                    client, server_side=True, ssl_context=served.http, standard_compatible=False
                )
                await wrapped.aclose()

    def renew(stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            pair = pairs[n % 2]
            # Each file is replaced whole (a rename): only the platform's own loading can mix them.
            for source, target in ((pair.key, files.key), (pair.cert, files.cert)):
                shutil.copy(source, target.with_suffix(".new"))
                os.replace(target.with_suffix(".new"), target)
            os.utime(files.cert, (n, n))  # a new stamp every time, whatever the clock's resolution
            served.reload_if_changed()

    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        stop = threading.Event()
        renewing = threading.Thread(target=renew, args=(stop,))
        renewing.start()
        try:
            with anyio.move_on_after(3):
                while True:
                    try:
                        await serial_served("127.0.0.1", port, trust)
                    except ssl.SSLCertVerificationError:
                        pass  # a half-copied pair is refused by its own check (the old one stays)
                    except (anyio.EndOfStream, ssl.SSLError, OSError) as err:
                        failures.append(err)
                    handshakes += 1
        finally:
            stop.set()
            renewing.join()
        tg.cancel_scope.cancel()
    assert handshakes > 50 and not failures, (handshakes, failures[:3])
