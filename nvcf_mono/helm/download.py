"""Downloading a chart archive from an https URL: bounded in size, https only (redirects too), basic auth."""

from __future__ import annotations

import base64
import ssl
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from nvcf_mono.contracts.egress import EgressRefused, host_refusal, parse
from nvcf_mono.egress_aiohttp import checked_session, url_refusal
from nvcf_mono.helm.errors import HelmRenderError
from nvcf_mono.helm.model import RegistryCredential
from nvcf_mono.helm.source import redact

_CHUNK = 64 * 1024
_MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _ssl_context(ca_file: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as err:
            raise HelmRenderError(f"cannot use the CA bundle {ca_file}: {err}") from err
    return context


async def download_archive(
    url: str,
    *,
    credential: RegistryCredential | None,
    max_size: int,
    ca_file: Path | None,
    networks: Sequence[str] | None = None,
) -> bytes:
    """The bytes at ``url``; the caller bounds the time (the renderer's deadline covers the download).
    ``networks``: a tenant's chart, fetched only from public addresses and these networks.
    """
    shown = redact(url)
    context = _ssl_context(ca_file)
    target = URL(url)
    origin = target.origin()
    auth = {}
    if credential is not None:
        pair = f"{credential.username}:{credential.password}".encode()
        auth = {"Authorization": "Basic " + base64.b64encode(pair).decode()}
    allowed = parse(networks) if networks is not None else None
    client = checked_session(allowed) if allowed is not None else aiohttp.ClientSession(trust_env=False)
    try:
        async with client as session:
            for _ in range(_MAX_REDIRECTS + 1):
                if allowed is not None and (why := url_refusal(target, allowed)) is not None:
                    raise HelmRenderError(refused(shown, why))
                # Redirects are followed here: each must stay https, and credentials stay with their origin.
                headers = auth if target.origin() == origin else {}
                async with session.get(target, headers=headers, ssl=context, allow_redirects=False) as response:
                    if response.status in _REDIRECTS and "Location" in response.headers:
                        target = response.url.join(URL(response.headers["Location"]))
                        if target.scheme != "https":
                            raise HelmRenderError(f"cannot download chart {shown}: redirected to a non-https URL")
                        continue
                    return await _body(response, shown, max_size)
    except aiohttp.ClientConnectorCertificateError as err:
        raise HelmRenderError(
            f"cannot download chart {shown}: the server's certificate is not trusted "
            f"({err.certificate_error}); plugins.helm.ca_file (--ca-file) adds a CA"
        ) from err
    except aiohttp.ClientConnectorError as err:
        why = err.os_error.strerror or str(err.os_error)
        if isinstance(err.os_error, EgressRefused):
            raise HelmRenderError(refused(shown, why)) from err
        raise HelmRenderError(f"cannot download chart {shown}: cannot connect to {err.host}:{err.port}: {why}") from err
    except aiohttp.ClientError as err:
        raise HelmRenderError(f"cannot download chart {shown}: {err}") from err
    raise HelmRenderError(f"cannot download chart {shown}: more than {_MAX_REDIRECTS} redirects")


def refused(shown: str, why: str, *, doing: str = "download") -> str:
    return (
        f"cannot {doing} chart {shown}: {why}; charts are fetched from public addresses and from the networks "
        "the operator lists in plugins.helm.chart_networks"
    )


async def check_registry(ref: str, shown: str, networks: Sequence[str] | None) -> None:
    """Before an OCI pull (the puller resolves the registry itself): every address of its host allowed."""
    if networks is None:
        return
    why = await host_refusal(urlsplit(ref).hostname or "", parse(networks), each=True)
    if why is not None:
        raise HelmRenderError(refused(shown, why, doing="pull"))


async def _body(response: aiohttp.ClientResponse, shown: str, max_size: int) -> bytes:
    if response.status != 200:
        hint = ": check the registry credentials" if response.status in (401, 403) else ""
        status = f"HTTP {response.status} {response.reason or ''}".rstrip()
        raise HelmRenderError(f"cannot download chart {shown}: {status}{hint}")
    if response.content_length is not None and response.content_length > max_size:
        raise HelmRenderError(_too_large(shown, max_size))
    data = bytearray()
    async for chunk in response.content.iter_chunked(_CHUNK):
        data += chunk
        if len(data) > max_size:
            raise HelmRenderError(_too_large(shown, max_size))
    if not data:
        raise HelmRenderError(f"cannot download chart {shown}: the response is empty")
    return bytes(data)


def _too_large(shown: str, max_size: int) -> str:
    return f"cannot download chart {shown}: it is larger than {max_size} bytes"
