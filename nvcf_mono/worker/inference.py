"""Calling the inference server: health checks, and one request turned into response frames.

Frames are produced as the server writes, so a server-sent-event stream reaches the client event by
event; the first frame carries the status and headers. Requests go through the worker's lean HTTP/1.1
client (:mod:`.http1`), health checks too.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping

import anyio
from yarl import URL

from nvcf_mono.contracts import env
from nvcf_mono.contracts.frames import COMPATIBILITY_OFF, Frame, Request, header_value
from nvcf_mono.contracts.problems import PROBLEM_CONTENT_TYPE, reason
from nvcf_mono.worker.config import WorkerConfig
from nvcf_mono.worker.http1 import BadResponse, Broken, Http1Client, Unreachable
from nvcf_mono.worker.large_output import MAX_DIRECT_RESPONSE

#: Headers of NVCF's worker contract toward the inference server; a client's copies are dropped (also
#: of the one this worker does not set: NVCF-NSPECTID, an NVIDIA product-security id nvcf-mono has no
#: counterpart of, so a function never takes a caller's forgery for the platform's word).
OWN_HEADERS = frozenset(
    h.lower()
    for h in (
        "NVCF-REQID", "NVCF-SUB", "NVCF-NCAID", "NVCF-FUNCTION-NAME", "NVCF-FUNCTION-ID",
        "NVCF-FUNCTION-VERSION-ID", "NVCF-ASSET-DIR", "NVCF-LARGE-OUTPUT-DIR", "NVCF-MAX-RESPONSE-SIZE-BYTES",
        "NVCF-NSPECTID", "NVCF-BACKEND", "NVCF-INSTANCETYPE", "NVCF-REGION", "NVCF-ENV", "NVCF-FUNCTION-ASSET-IDS",
        "NVCF-INVOCATION-REGION", "Host", "Content-Length", "Transfer-Encoding", "Connection",
    )
)  # fmt: skip
MAX_DIRECT_RESPONSE_TEXT = str(MAX_DIRECT_RESPONSE)
#: Redirects a health check follows on the server (Go's HTTP client, NVCF's worker, follows up to 10).
MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"})


class InferenceCrashed(Exception):
    """The inference server went away during the request (the request may have killed it)."""


class InferenceUnreachable(InferenceCrashed):
    """The inference server did not accept the connection: nothing of the request was sent."""


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
            "NVCF-ENV": env.PLATFORM_ENV,
            "NVCF-MAX-RESPONSE-SIZE-BYTES": MAX_DIRECT_RESPONSE_TEXT,
        }
    )
    if request.invocation_region:
        headers["NVCF-INVOCATION-REGION"] = request.invocation_region  # the accepting node's, not the client's
    if request.asset_ids:
        headers["NVCF-FUNCTION-ASSET-IDS"] = ",".join(request.asset_ids)
    if compatible(request) and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"  # compatibility mode's default
    return headers


def compatible(request: Request) -> bool:
    """NVCF's worker compatibility mode: on unless the client streams (``Accept: text/event-stream``) or
    turns it off (``nvcf-feature-disable-worker-compatibility: true``).
    """
    if request.streaming:
        return False
    return not any(k.lower() == COMPATIBILITY_OFF and v.strip().lower() == "true" for k, v in request.headers)


def health_client(config: WorkerConfig) -> Http1Client:
    """The worker's client for its health checks: the inference server's health port, kept alive."""
    return Http1Client(config.inference_host, config.health_port, connect_timeout=config.health_timeout)


async def check_health(client: Http1Client, config: WorkerConfig) -> tuple[bool, str]:
    """One health check of the inference server (HTTP, or grpc.health.v1): (healthy, why not).

    Redirects on the server itself are followed, as HTTP clients do (a framework's trailing-slash
    redirect must not make a server unhealthy), up to :data:`MAX_REDIRECTS`; the status that counts
    is the last one.
    """
    if config.health_protocol == "grpc":
        from nvcf_mono.worker.grpc_relay import check_grpc_health  # it imports this module

        return await check_grpc_health(config)
    origin = URL.build(scheme="http", host=config.inference_host, port=config.health_port)
    url = origin.join(URL(config.health_endpoint))
    try:
        with anyio.fail_after(config.health_timeout):
            for _ in range(MAX_REDIRECTS + 1):
                async with client.request("GET", url.raw_path_qs, {}, b"") as resp:
                    while await resp.read(1 << 16):
                        pass  # read whole, so the connection serves the next check
                location = header_value(resp.headers, "location")
                if resp.status not in _REDIRECTS or location is None or resp.status == config.health_expected_status:
                    break
                target = url.join(URL(location))
                if target.origin() != origin:
                    return False, f"{url} redirects to another server ({target}); health checks stay on {origin}"
                url = target
        if resp.status == config.health_expected_status:
            return True, ""
        return False, f"{url} answered {resp.status}, expected {config.health_expected_status}"
    except TimeoutError:
        return False, f"{url}: no answer within {config.health_timeout:g}s"
    except (Unreachable, Broken, BadResponse, OSError, ValueError) as err:
        return False, f"{url}: {type(err).__name__}: {err}"


async def call(
    client: Http1Client,
    config: WorkerConfig,
    request: Request,
    body: bytes | AsyncIterable[bytes],
    headers: Mapping[str, str],
    *,
    attempt: int,
    received: float | None = None,
) -> AsyncIterator[Frame]:
    """Serve one request; yields its frames as the server writes.

    The first frame carries the worker's timing (:attr:`Frame.timing`): since ``received`` (the
    ``time.perf_counter()`` when the worker took the request) and the server's own time to its head.

    Raises :class:`InferenceUnreachable` when nothing could be sent (the server is not listening),
    :class:`InferenceCrashed` when the server went away during the call.
    """
    rid = request.request_id
    size = config.frame_size
    called = time.perf_counter()
    try:
        async with client.request(request.method, request.path, headers, body) as resp:
            head = tuple([(k, v) for k, v in resp.headers if k.lower() not in HOP_BY_HOP])
            now = time.perf_counter()
            timing = (round((now - (received or called)) * 1000, 3), round((now - called) * 1000, 3))
            length = resp.content_length
            content = resp
            seq = 0
            total = 0
            while True:
                chunk = await content.read(size)
                # Fill the frame with what has already arrived, but never wait for more: a stream
                # (server-sent events) goes out piece by piece as the server writes it.
                while chunk and len(chunk) < size:
                    more = content.read_nowait(size - len(chunk))
                    if not more:
                        break
                    chunk += more
                total += len(chunk)
                # The last piece carries the end when it is known to be last (a fixed length, or
                # the end already read): a small response is one frame. Otherwise an empty end follows.
                done = not chunk or (length is not None and total >= length) or content.at_eof()
                yield Frame(
                    request_id=rid,
                    seq=seq,
                    attempt=attempt,
                    status=resp.status if seq == 0 else None,
                    headers=head if seq == 0 else (),
                    body=chunk,
                    end=done,
                    total_length=total if done else None,
                    timing=timing if seq == 0 else None,
                )
                if done:
                    return
                seq += 1
    except Unreachable as err:
        raise InferenceUnreachable(str(err)) from err
    except (Broken, OSError) as err:
        raise InferenceCrashed(f"{type(err).__name__}: {err}") from err


#: Sources of the worker's synthetic errors (``urn:<source>:problem-details:<reason>``).


def problem_frame(request_id: str, attempt: int, status: int, detail: str, *, source: str) -> Frame:
    """A synthetic error response as NVCF's worker writes them: problem+json, passed to the client as is."""
    title = reason(status)
    body = json.dumps(
        {
            "type": f"urn:{source}:problem-details:{title.lower().replace(' ', '-')}",
            "title": title,
            "status": status,
            "detail": detail,
        }
    ).encode()
    return Frame(
        request_id=request_id,
        seq=0,
        attempt=attempt,
        status=status,
        headers=(("Content-Type", PROBLEM_CONTENT_TYPE), ("Content-Length", str(len(body)))),
        body=body,
        end=True,
        total_length=len(body),
    )
