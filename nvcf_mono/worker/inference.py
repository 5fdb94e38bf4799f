"""Calling the inference server: health checks, and one request turned into response frames.

Frames are produced as the server writes (``iter_any``), so a server-sent-event stream reaches
the client event by event; the first frame carries the status and headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping

import aiohttp

from nvcf_mono.contracts.frames import Frame, Problem, Request
from nvcf_mono.worker.config import WorkerConfig

#: Headers the worker sets toward the inference server; a client's copies are dropped.
OWN_HEADERS = frozenset(
    h.lower()
    for h in (
        "NVCF-REQID", "NVCF-SUB", "NVCF-NCAID", "NVCF-FUNCTION-NAME", "NVCF-FUNCTION-ID",
        "NVCF-FUNCTION-VERSION-ID", "NVCF-ASSET-DIR", "NVCF-LARGE-OUTPUT-DIR", "NVCF-MAX-RESPONSE-SIZE-BYTES",
        "NVCF-BACKEND", "NVCF-INSTANCETYPE", "NVCF-REGION", "NVCF-FUNCTION-ASSET-IDS", "Host", "Content-Length",
        "Transfer-Encoding", "Connection",
    )
)  # fmt: skip
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"})


class InferenceCrashed(Exception):
    """The inference server went away during the request (the request may have killed it)."""


def request_headers(config: WorkerConfig, request: Request, *, asset_dir: str, output_dir: str) -> dict[str, str]:
    """The client's headers plus the ``NVCF-*`` headers of the worker contract."""
    headers = {k: v for k, v in request.headers if k.lower() not in OWN_HEADERS}
    headers.update(
        {
            "NVCF-REQID": request.request_id,
            "NVCF-SUB": request.client_subject,
            "NVCF-NCAID": request.nca_id,
            "NVCF-FUNCTION-NAME": request.function_name or config.function_name,
            "NVCF-FUNCTION-ID": request.function_id,
            "NVCF-FUNCTION-VERSION-ID": request.function_version_id,
            "NVCF-ASSET-DIR": asset_dir,
            "NVCF-LARGE-OUTPUT-DIR": output_dir,
            "NVCF-BACKEND": config.backend,
            "NVCF-INSTANCETYPE": config.instance_type,
            "NVCF-REGION": config.region,
        }
    )
    if request.asset_ids:
        headers["NVCF-FUNCTION-ASSET-IDS"] = ",".join(request.asset_ids)
    return headers


async def check_health(session: aiohttp.ClientSession, config: WorkerConfig) -> tuple[bool, str]:
    """One HTTP health check of the inference server: (healthy, why not)."""
    url = f"http://{config.inference_host}:{config.health_port}{config.health_endpoint}"
    try:
        timeout = aiohttp.ClientTimeout(total=config.health_timeout)
        async with session.get(url, timeout=timeout) as resp:
            await resp.read()
            if resp.status == config.health_expected_status:
                return True, ""
            return False, f"{url} answered {resp.status}, expected {config.health_expected_status}"
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        return False, f"{url}: {type(err).__name__}: {err}"


async def call(
    session: aiohttp.ClientSession,
    config: WorkerConfig,
    request: Request,
    body: bytes | AsyncIterable[bytes],
    headers: Mapping[str, str],
    *,
    attempt: int,
) -> AsyncIterator[Frame]:
    """Serve one request; yields its frames. Raises :class:`InferenceCrashed` if the server dies."""
    url = config.inference_base + request.path
    rid = request.request_id
    try:
        async with session.request(
            request.method,
            url,
            data=body,
            headers=dict(headers),
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.health_timeout),
            auto_decompress=False,
        ) as resp:
            head = tuple((k, v) for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP)
            seq = 0
            total = 0
            pending: bytes | None = None
            first = True
            async for chunk in resp.content.iter_chunked(config.frame_size):
                if pending is not None:
                    yield Frame(
                        request_id=rid,
                        seq=seq,
                        attempt=attempt,
                        status=resp.status if first else None,
                        headers=head if first else (),
                        body=pending,
                    )
                    first = False
                    seq += 1
                pending = chunk
                total += len(chunk)
            body_last = pending or b""
            yield Frame(
                request_id=rid,
                seq=seq,
                attempt=attempt,
                status=resp.status if first else None,
                headers=head if first else (),
                body=body_last,
                end=True,
                total_length=total,
            )
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as err:
        raise InferenceCrashed(f"{type(err).__name__}: {err}") from err
    except aiohttp.ClientConnectorError as err:
        raise InferenceCrashed(f"cannot connect to the inference server at {url}: {err}") from err


def problem_frame(request_id: str, attempt: int, status: int, detail: str, *, source: str) -> Frame:
    """A synthetic error as NVCF's worker writes them (``urn:<source>:problem-details:...``)."""
    return Frame(
        request_id=request_id,
        seq=0,
        attempt=attempt,
        problem=Problem(status=status, detail=detail, type=f"urn:{source}:problem-details:error"),
    )
