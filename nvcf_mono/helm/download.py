"""Downloading a chart archive from an https URL: bounded in size, https only (redirects too), basic auth."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import aiohttp
from yarl import URL

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
    url: str, *, credential: RegistryCredential | None, max_size: int, ca_file: Path | None
) -> bytes:
    """The bytes at ``url``; the caller bounds the time (the renderer's deadline covers the download)."""
    shown = redact(url)
    context = _ssl_context(ca_file)
    target = URL(url)
    origin = target.origin()
    auth = {}
    if credential is not None:
        pair = f"{credential.username}:{credential.password}".encode()
        auth = {"Authorization": "Basic " + base64.b64encode(pair).decode()}
    try:
        async with aiohttp.ClientSession(trust_env=False) as session:
            for _ in range(_MAX_REDIRECTS + 1):
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
        raise HelmRenderError(f"cannot download chart {shown}: cannot connect to {err.host}:{err.port}: {why}") from err
    except aiohttp.ClientError as err:
        raise HelmRenderError(f"cannot download chart {shown}: {err}") from err
    raise HelmRenderError(f"cannot download chart {shown}: more than {_MAX_REDIRECTS} redirects")


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
