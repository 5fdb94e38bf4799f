"""The worker's own health endpoints and metrics (``HEALTH_PORT``): what probes, the agent and Prometheus look at.

Three GET routes answered from the worker's state, one request per connection. The worker does not
import aiohttp for them: aiohttp's import makes two TLS contexts and loads the system's CA store
(about 0.1 s of the worker's 0.35 s start on the reference machine), and the worker's start is on
every cold start's path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import anyio
from anyio.abc import SocketAttribute, SocketListener, SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from nvcf_mono.contracts.problems import PROBLEM_CONTENT_TYPE, problem_body, reason
from nvcf_mono.metrics import CONTENT_TYPE, Metrics
from nvcf_mono.worker.agent import WorkerState

log = logging.getLogger("nvcf_mono.worker")

#: Longest request head read; a probe's is a few hundred bytes.
MAX_HEAD = 16 * 1024
#: Connections served at once; more wait to be accepted.
MAX_CLIENTS = 32
#: Pause after a failed accept (no file descriptor left) before the next.
ACCEPT_PAUSE = 0.1
#: How long a connection may take to send its request head, and to take the answer.
CLIENT_TIMEOUT = 10.0

_Answer = tuple[int, str, bytes]


async def serve_health(
    state: WorkerState, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """``/v1/health/live`` (the process runs), ``/v1/health/ready`` (it serves) and ``/metrics``
    (Prometheus text, read from the worker's state at each scrape); reports the port.
    """
    registry = worker_metrics(state)

    def live() -> _Answer:
        return 200, "application/json", b'{"status": "live"}'

    def ready() -> _Answer:
        body: dict[str, object] = {
            "status": "ready" if state.ready else "not ready",
            "inferenceHealthy": state.inference_healthy,
            "connected": state.connected,
            "draining": state.draining,
            "inFlight": state.in_flight,
            "served": state.served,
            "sessions": state.sessions,
        }
        if state.detail:
            body["detail"] = state.detail
        return 200 if state.ready else 503, "application/json", json.dumps(body).encode()

    def metrics() -> _Answer:
        return 200, CONTENT_TYPE, registry.render().encode()

    routes: dict[str, Callable[[], _Answer]] = {"/v1/health/live": live, "/v1/health/ready": ready, "/metrics": metrics}

    room = anyio.Semaphore(MAX_CLIENTS)

    async def serve(client: SocketStream) -> None:
        async with client:
            try:
                with anyio.fail_after(CLIENT_TIMEOUT):
                    head = await BufferedByteReceiveStream(client).receive_until(b"\r\n\r\n", MAX_HEAD)
                    method, path = _request_line(head)
                    await client.send(_response(method, *_answer(routes, method, path)))
            except (
                anyio.EndOfStream,
                anyio.IncompleteRead,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                anyio.DelimiterNotFound,
                TimeoutError,
                OSError,
            ):
                pass  # the client went away, was too slow, or sent no HTTP head
            finally:
                room.release()

    # Port 0 (tests, the process backend's auto ports): loopback only; a fixed port is for probes from outside.
    listeners = await anyio.create_tcp_listener(local_host="127.0.0.1" if port == 0 else "0.0.0.0", local_port=port)
    (listener,) = listeners.listeners  # one address: one socket, accepted from here to bound the clients
    assert isinstance(listener, SocketListener)
    async with listeners, anyio.create_task_group() as tg:
        task_status.started(int(listener.extra(SocketAttribute.local_port)))
        while True:
            await room.acquire()  # a flood of connections waits in the listen backlog, not in memory
            try:
                client = await listener.accept()
            except OSError as err:  # out of file descriptors, say: the port lives on, and tries again
                room.release()
                log.warning("the health port could not accept a connection: %s", err)
                await anyio.sleep(ACCEPT_PAUSE)
                continue
            except BaseException:
                room.release()
                raise
            tg.start_soon(serve, client)


def _request_line(head: bytes) -> tuple[str, str]:
    """Method and path (query dropped) of a request head; ``("", "")`` when it is not HTTP/1.x."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return "", ""
    return parts[0].decode("latin-1"), parts[1].decode("latin-1").split("?", 1)[0]


def _answer(routes: dict[str, Callable[[], _Answer]], method: str, path: str) -> _Answer:
    """The route's answer; a route that fails is a 500 for this request, never the end of the port."""
    try:
        return _route(routes, method, path)
    except Exception as err:
        log.exception("the health port could not answer %s %s", method, path)
        return _problem(500, f"{type(err).__name__} while answering {path}")


def _route(routes: dict[str, Callable[[], _Answer]], method: str, path: str) -> _Answer:
    if not method:
        return _problem(400, "the request is not HTTP/1.x")
    answer = routes.get(path)
    if answer is None:
        return _problem(404, f"no such route: {path}; this port serves {', '.join(sorted(routes))}")
    if method not in ("GET", "HEAD"):
        return _problem(405, f"{path} answers GET and HEAD, not {method}")
    return answer()


def _problem(status: int, detail: str) -> _Answer:
    return status, PROBLEM_CONTENT_TYPE, json.dumps(problem_body(status, detail)).encode()


def _response(method: str, status: int, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason(status)}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    if status == 405:
        head = head[:-2] + "Allow: GET, HEAD\r\n\r\n"
    return head.encode() + (b"" if method == "HEAD" else body)


def worker_metrics(state: WorkerState) -> Metrics:
    """The worker's own series (NVCF's ``worker_thread_busy_seconds`` among them), read from its state."""
    registry = Metrics()

    def one(read: Callable[[], float]) -> Callable[[], list[tuple[tuple[str, ...], float]]]:
        return lambda: [((), float(read()))]

    registry.counter(
        "worker_thread_busy_seconds", "Slot-seconds spent serving requests (the autoscaler's utilization)."
    ).set_function(one(lambda: state.busy_seconds))
    registry.counter("nvcf_worker_requests_total", "Requests this worker finished serving.").set_function(
        one(lambda: state.served)
    )
    registry.gauge("nvcf_worker_requests_in_flight", "Requests being served now.").set_function(
        one(lambda: state.in_flight)
    )
    registry.gauge(
        "nvcf_worker_inference_healthy", "1 while the inference server answers its health check."
    ).set_function(one(lambda: state.inference_healthy))
    registry.gauge("nvcf_worker_connected", "1 while connected to the invocation plane.").set_function(
        one(lambda: state.connected)
    )
    registry.counter("nvcf_worker_sessions_total", "Sessions opened with the invocation plane.").set_function(
        one(lambda: state.sessions)
    )
    return registry
