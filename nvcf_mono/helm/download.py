"""Fetching a remote chart over https, by this process: an archive at an https URL, or an ``oci://`` chart
from its registry (:mod:`nvcf_mono.helm.oci`). Both renderers then read the archive locally, so a tenant's
chart is fetched once, through one client that checks every address it connects to.

Every request is https (redirects too), bounded in size, and sends credentials only to the origin they
were given for; a redirect elsewhere (a registry's blob storage) goes without them.
"""

from __future__ import annotations

import base64
import os
import ssl
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import TracebackType

import aiohttp
import attrs
from multidict import CIMultiDictProxy
from yarl import URL

from nvcf_mono.contracts.egress import EgressRefused, parse, server_of
from nvcf_mono.egress_aiohttp import checked_session, url_refusal
from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RegistryCredential, RendererOptions
from nvcf_mono.helm.source import ChartSource, redact
from nvcf_mono.printable import one_line

_CHUNK = 64 * 1024
_MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: What is read of an answer that is not a 200, for the message.
_ERROR_BODY = 16 * 1024
#: aiohttp's own default for a request (the session's), unless a caller gives another.
_SESSION_TIMEOUT = aiohttp.ClientTimeout(total=300, sock_connect=30)


@attrs.frozen
class Fetched:
    """An answer: its status, headers and (bounded) body, and the URL that gave it."""

    status: int
    reason: str
    headers: CIMultiDictProxy[str]
    body: bytes
    url: URL

    def status_text(self) -> str:
        return status_text(self.status, self.reason)


class TooLarge(Exception):
    """An answer's body is larger than its limit."""


class Unauthorized(HelmRenderError):
    """The server (or its token service) refused the credential, or asked for one."""

    def __init__(self, error: HelmRenderError) -> None:
        super().__init__(str(error))


class NotFound(HelmRenderError):
    """The registry has no such manifest, or shows none to this credential (some hide what it may not read)."""


class Fetcher:
    """An https client for what a tenant names (a chart, an image's registry): ``doing`` ("download", "pull",
    "check") and ``subject`` ("chart oci://...", "image nvcr.io/...") name it in messages.

    ``networks``: a tenant's, reached only at public addresses and in these networks (None: unchecked);
    ``networks_setting`` names the setting that lists them, in refusals; ``plain_http`` lists the servers
    (``host[:port]``, as URLs name them) reached over plain http instead, the operator's; and
    ``plain_http_hint`` ends the message for a server that does not speak TLS (what the operator can do).
    """

    def __init__(
        self,
        subject: str,
        doing: str,
        *,
        ca_file: Path | None,
        networks: Sequence[str] | None,
        networks_setting: str = "plugins.helm.chart_networks",
        plain_http: Collection[str] = (),
        plain_http_hint: str = "",
    ) -> None:
        self.subject = subject
        self.doing = doing
        self.networks_setting = networks_setting
        self.plain_http_hint = plain_http_hint
        self._plain_http = frozenset(server.lower() for server in plain_http)
        self._context = _ssl_context(ca_file)
        self._allowed = parse(networks) if networks is not None else None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Fetcher:
        allowed = self._allowed
        self._session = checked_session(allowed) if allowed is not None else aiohttp.ClientSession(trust_env=False)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()

    def fail(self, why: str) -> HelmRenderError:
        return HelmRenderError(f"cannot {self.doing} {self.subject}: {why}")

    async def get(self, url: str | URL, *, limit: int, headers: Mapping[str, str] | None = None) -> Fetched:
        """GET ``url``, following redirects (each https and checked); ``headers`` go to ``url``'s origin only.
        A 200's body is read whole (``limit`` bytes at most, else :class:`TooLarge`); other answers' only in part.
        """
        async with self.open(url, headers=headers) as got:
            size = limit if got.status == 200 else _ERROR_BODY
            body = await _body(got, size, whole=got.status == 200)
            return Fetched(got.status, got.reason or "", got.headers, body, got.url)

    @asynccontextmanager
    async def open(
        self, url: str | URL, *, headers: Mapping[str, str] | None = None, timeout: aiohttp.ClientTimeout | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The answer to GET ``url`` after its redirects, its body unread (for a stream); as :meth:`get`.
        ``timeout``: aiohttp's, for a body too long for the session's five minutes.
        """
        assert self._session is not None, "use the fetcher as an async context manager"
        target = URL(url)
        origin = target.origin()
        for hop in range(_MAX_REDIRECTS + 1):
            if target.scheme != "https" and (target.scheme, self.scheme(server_of(target))) != ("http", "http"):
                shown = redact(str(target))
                raise self.fail("redirected to a non-https URL" if hop else f"{shown} is not an https URL")
            if self._allowed is not None and (why := url_refusal(target, self._allowed)) is not None:
                raise HelmRenderError(self.refused(why))
            sent = dict(headers or {}) if target.origin() == origin else {}
            with self._errors():
                async with self._session.get(
                    target, headers=sent, ssl=self._context, allow_redirects=False, timeout=timeout or _SESSION_TIMEOUT
                ) as got:
                    if got.status in _REDIRECTS and "Location" in got.headers:
                        target = got.url.join(URL(got.headers["Location"]))
                        continue
                    yield got
                    return
        raise self.fail(f"more than {_MAX_REDIRECTS} redirects")

    def scheme(self, server: str) -> str:
        """How ``server`` (``host[:port]``) is reached: https, or http where the operator listed it."""
        return "http" if server.lower() in self._plain_http else "https"

    def refused(self, why: str) -> str:
        return (
            f"cannot {self.doing} {self.subject}: {why}; charts and image registries are reached at public "
            f"addresses and in the networks the operator lists in {self.networks_setting}"
        )

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except aiohttp.ClientConnectorCertificateError as err:
            raise self.fail(
                f"the server's certificate is not trusted ({err.certificate_error}); "
                "plugins.helm.ca_file (--ca-file) adds a CA"
            ) from err
        except aiohttp.ClientConnectorError as err:
            if isinstance(err.os_error, EgressRefused):
                raise HelmRenderError(self.refused(str(err.os_error.strerror))) from err
            if isinstance(err.os_error, ssl.SSLError):  # its errno is OpenSSL's, not the system's
                reason = (err.os_error.reason or str(err.os_error)).lower().replace("_", " ")
                raise self.fail(
                    f"no TLS session with {err.host}:{err.port} ({one_line(reason)[:100]}); it is reached over "
                    f"https only{self.plain_http_hint}"
                ) from err
            # asyncio's strerror is "Connect call failed (...)"; the errno says what happened.
            code = err.os_error.errno
            why = (os.strerror(code) if code else "") or err.os_error.strerror or str(err.os_error)
            raise self.fail(f"cannot connect to {err.host}:{err.port}: {why}") from err
        except aiohttp.ClientError as err:
            raise self.fail(str(err) or type(err).__name__) from err


def chart_fetcher(options: RendererOptions, subject: str, doing: str) -> Fetcher:
    """A :class:`Fetcher` for a chart or the images it names, as the Helm settings say."""
    return Fetcher(
        subject,
        doing,
        ca_file=options.ca_file,
        networks=options.chart_networks,
        plain_http=options.plain_http,
        plain_http_hint=" (unless plugins.helm.plain_http_registries or --plain-http-registry lists it)",
    )


async def fetch_chart(
    source: ChartSource, credentials: Sequence[RegistryCredential], options: RendererOptions
) -> bytes:
    """The archive of a remote chart (https or oci); the caller bounds the time (the render's deadline).

    As ReVal does: each credential in turn and then none, the first that works wins; a refused credential
    (401, 403) moves on, other failures are collected. None working: the distinct failures, or that no
    credential was valid.
    """
    from nvcf_mono.helm.oci import pull_chart

    doing = "pull" if source.kind == "oci" else "download"
    failures: list[str] = []
    for credential in [*credentials, None]:
        fetcher = chart_fetcher(options, f"chart {source.display}", doing)
        try:
            async with fetcher:
                if source.kind == "oci":
                    return await pull_chart(fetcher, source.ref, credential, max_size=options.max_chart_size)
                return await _download(fetcher, source.ref, credential, max_size=options.max_chart_size)
        except Unauthorized:
            continue
        except HelmRenderError as err:
            if str(err) not in failures:
                failures.append(str(err))
    if failures:
        raise HelmRenderError("; ".join(failures))
    raise HelmRenderError(
        f'no credential was valid to pull chart "{source.display}", manually verify credentials are valid'
    )


async def _download(fetcher: Fetcher, url: str, credential: RegistryCredential | None, *, max_size: int) -> bytes:
    headers = {"Authorization": basic_auth(credential)} if credential is not None else {}
    try:
        got = await fetcher.get(url, limit=max_size, headers=headers)
    except TooLarge:
        raise fetcher.fail(f"it is larger than {max_size} bytes") from None
    if got.status in (401, 403):
        raise Unauthorized(fetcher.fail(f"{got.status_text()}: check the registry credentials"))
    if got.status != 200:
        raise fetcher.fail(got.status_text())
    if not got.body:
        raise fetcher.fail("the response is empty")
    return got.body


def status_text(status: int, reason: str | None) -> str:
    """``HTTP 404 Not Found``: the reason is the server's, so on one line and short."""
    return f"HTTP {status} {one_line(reason or '')[:100]}".rstrip()


def basic_auth(credential: RegistryCredential) -> str:
    pair = f"{credential.username}:{credential.password}".encode()
    return "Basic " + base64.b64encode(pair).decode()


def _ssl_context(ca_file: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as err:
            raise HelmRenderError(f"cannot use the CA bundle {ca_file}: {err}") from err
    return context


async def _body(response: aiohttp.ClientResponse, limit: int, *, whole: bool) -> bytes:
    """Up to ``limit`` bytes of the body; with ``whole``, more than that is :class:`TooLarge`."""
    if whole and response.content_length is not None and response.content_length > limit:
        raise TooLarge
    data = bytearray()
    async for chunk in response.content.iter_chunked(_CHUNK):
        data += chunk
        if len(data) > limit:
            if whole:
                raise TooLarge
            break
    return bytes(data[:limit])
