"""TLS for the host's listeners: certificate files (reloaded when they change) or a development CA.

The HTTP port answers HTTP/1.1 over TLS, the gRPC port HTTP/2 (ALPN ``h2``). A certificate and key
pair replaced on disk (a renewal, cert-manager rewriting its Secret) is taken up by the next
connection, without a restart; connections already open keep theirs.

``tls.self_signed`` makes a development CA and a certificate for this machine's names under
``<state_dir>/tls/`` once (kept across restarts): clients trust ``ca.pem``, which ``endpoints.json``
names, and the platform's own workers are handed it.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
import ssl
from collections.abc import Iterable
from pathlib import Path
from typing import final

import anyio
import attrs
from anyio.abc import TaskStatus

from nvcf_mono.config.model import ListenerTlsSettings
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.state_dir import write_private

log = logging.getLogger("nvcf_mono.tls")

TLS_DIR = "tls"
#: How long a generated development certificate is valid; it is made again when it is about to end.
VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)


class TlsError(NvcfMonoError):
    """A certificate or key cannot be used."""


@attrs.frozen
class CertFiles:
    """A certificate chain and its key on disk, and what clients should trust (None: the system's CAs)."""

    cert: Path
    key: Path
    ca: Path | None = None


#: The listeners' protocols: HTTP/1.1 (the API) and HTTP/2 (gRPC).
_ALPNS = ("http/1.1", "h2")


def _context(files: CertFiles, alpn: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols([alpn])
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as err:
        raise TlsError(f"cannot use the certificate {files.cert} with the key {files.key}: {err}") from err
    return context


def _stamp(files: CertFiles) -> tuple[float, ...]:
    try:
        return (files.cert.stat().st_mtime, files.key.stat().st_mtime)
    except OSError:
        return ()


@final
class ServerTls:
    """The server contexts of the HTTP and gRPC listeners, kept in step with the files.

    A listener keeps the context it was made with; each handshake is handed the pair last loaded
    (``sni_callback``, called on every client hello). A renewal loads the new pair into new contexts
    and swaps them in whole: loading into the contexts in use let a handshake made in between take
    the new certificate with the old key, and fail.
    """

    def __init__(self, files: CertFiles) -> None:
        self.files = files
        self._live = {alpn: _context(files, alpn) for alpn in _ALPNS}
        self.http = self._listening("http/1.1")
        self.grpc = self._listening("h2")
        self._stamp = _stamp(files)
        self._refused: tuple[float, ...] = ()

    def _listening(self, alpn: str) -> ssl.SSLContext:
        context = _context(self.files, alpn)

        def latest(conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _context: ssl.SSLContext) -> None:
            live = self._live[alpn]
            if conn.context is not live:
                conn.context = live

        context.sni_callback = latest
        return context

    def reload_if_changed(self) -> bool:
        """Load the files again when either changed; a pair that does not load leaves the old one in use."""
        stamp = _stamp(self.files)
        if not stamp or stamp in (self._stamp, self._refused):
            return False
        try:
            loaded = {alpn: _context(self.files, alpn) for alpn in _ALPNS}
        except TlsError as err:
            self._refused = stamp  # said once; the next change is tried again
            log.error("%s; still serving the previous certificate", err)
            return False
        self._live = loaded
        self._stamp = stamp
        log.info("reloaded the TLS certificate %s", self.files.cert)
        return True

    async def watch(self, interval: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await anyio.sleep(interval)
            await anyio.to_thread.run_sync(self.reload_if_changed)


def server_tls(settings: ListenerTlsSettings, state_dir: Path, names: Iterable[str]) -> ServerTls | None:
    """The listeners' TLS as configured (None: plaintext)."""
    if settings.self_signed:
        made = development_certificate(state_dir, names)
        return ServerTls(attrs.evolve(made, ca=settings.ca_file or made.ca))
    if settings.cert_file is None or settings.key_file is None:
        return None
    return ServerTls(CertFiles(cert=settings.cert_file, key=settings.key_file, ca=settings.ca_file))


def development_certificate(state_dir: Path, names: Iterable[str] = ()) -> CertFiles:
    """``<state_dir>/tls/{ca,cert,key}.pem``: made on first use (or when about to expire), then reused."""
    directory = state_dir / TLS_DIR
    ca = directory / "ca.pem"
    files = CertFiles(cert=directory / "cert.pem", key=directory / "key.pem", ca=ca)
    wanted = sorted({"localhost", "127.0.0.1", "::1", socket.gethostname(), *names} - {"", "0.0.0.0", "::"})
    if _still_good(files, wanted):
        return files
    ca_pem, cert_pem, key_pem = _make(wanted)
    write_private(files.key, key_pem)
    write_private(files.cert, cert_pem, mode=0o644)
    write_private(ca, ca_pem, mode=0o644)
    log.info("made a development CA and certificate for %s in %s (trust %s)", ", ".join(wanted), directory, files.ca)
    return files


def _still_good(files: CertFiles, wanted: list[str]) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        if not files.key.exists() or files.ca is None or not files.ca.exists():
            return False
    except (OSError, ValueError):
        return False
    if cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) < RENEW_BEFORE:
        return False
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    have = {str(n) for n in san.get_values_for_type(x509.DNSName)}
    have |= {str(n) for n in san.get_values_for_type(x509.IPAddress)}
    return set(wanted) <= have


def _make(names: list[str]) -> tuple[bytes, bytes, bytes]:
    """A CA (its key forgotten at once) and a server certificate it signed for ``names``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"nvcf-mono development CA ({socket.gethostname()})")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca.public_bytes(pem), cert.public_bytes(pem) + ca.public_bytes(pem), key_pem
