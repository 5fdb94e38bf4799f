"""An external NATS over TLS with client certificates: bus.url tls://, bus.tls.* files."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nvcf_mono.bus.embedded import find_nats_server
from nvcf_mono.bus.errors import BusUnavailable
from nvcf_mono.config.model import TlsSettings
from nvcf_mono.ports import spare_port
from nvcf_mono.testing.host import config_for_test, running_host
from tests.conftest import connect


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".pem")
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


def _issue(ca_key, ca_name, name: str, usage, san=None):  # type: ignore[no-untyped-def]
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if san:
        builder = builder.add_extension(san, critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


@pytest.fixture
def tls_nats(tmp_path: Path):  # type: ignore[no-untyped-def]
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nvcf-mono test CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _, ca_pem = _write(tmp_path / "ca", ca_key, ca)
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server_key, server_pem = _write(
        tmp_path / "server", *_issue(ca_key, ca_name, "localhost", ExtendedKeyUsageOID.SERVER_AUTH, san)
    )
    client_key, client_pem = _write(
        tmp_path / "client", *_issue(ca_key, ca_name, "nvcf-mono", ExtendedKeyUsageOID.CLIENT_AUTH)
    )
    port = spare_port()
    conf = tmp_path / "tls.conf"
    conf.write_text(f"""
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{tmp_path / "js"}" }}
tls {{
  cert_file: "{server_pem}"
  key_file: "{server_key}"
  ca_file: "{ca_pem}"
  verify: true
  timeout: 5
}}
""")
    proc = subprocess.Popen(
        [str(find_nats_server(None)), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "TLS nats-server did not start"
                time.sleep(0.02)
        yield {"url": f"tls://127.0.0.1:{port}", "ca": ca_pem, "cert": client_pem, "key": client_key}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_host_connects_to_a_tls_nats_with_a_client_certificate(tmp_path: Path, tls_nats) -> None:  # type: ignore[no-untyped-def]
    config = config_for_test(
        tmp_path / "state",
        nats_url=tls_nats["url"],
        settings={
            "bus.tls.ca_file": str(tls_nats["ca"]),
            "bus.tls.cert_file": str(tls_nats["cert"]),
            "bus.tls.key_file": str(tls_nats["key"]),
        },
    )
    async with running_host(config) as host:
        assert host.embedded is None
        with anyio.fail_after(10):
            async with host.bus.subscribe("tls.check") as sub:
                await host.bus.publish("tls.check", b"secure")
                assert (await sub.next(timeout=5)).data == b"secure"


async def test_without_the_client_certificate_the_connection_is_refused(tls_nats) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(15), pytest.raises(BusUnavailable, match="could not connect to NATS"):
        async with connect(tls_nats["url"], connect_retry_for=1.0, tls=TlsSettings(ca_file=tls_nats["ca"])):
            pass
