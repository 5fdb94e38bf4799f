"""OpenTelemetry traces of invocations: one span per hop, one trace from the caller to the function.

Off unless an OTLP endpoint is configured (``tracing.otlp_endpoint`` on the host,
``NVCF_TRACES_ENDPOINT`` in a worker, and a worker's function's traces telemetry), and then only
with the ``otel`` extra installed; switched
off, every call here returns at once and nothing of OpenTelemetry is imported.

The spans of one invocation (W3C trace context throughout):

- ``<METHOD> <route>`` (server): the invocation node serving the caller, a child of the caller's
  ``traceparent`` when it sent one;
- ``enqueue`` (producer): the durable publish; its context rides in the request's headers, which
  the worker gets on either transport (the stored request is never re-encoded on its way);
- ``deliver`` (consumer): the node that took the request from the queue handing it to a worker;
- ``serve`` (consumer, in the worker) and ``call`` (client): the worker's handling and its call to
  the inference server, which gets the ``call`` span as its ``traceparent`` so its own spans join;
- ``relay``: the node writing the response to the caller.

The tracer is process-wide (like logging's root): one per host or worker process.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, final
from urllib.parse import urlsplit

import attrs

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span as Span  # noqa: PLC0414 - re-exported for the planes and the worker
    from opentelemetry.trace import Tracer

#: The W3C trace context headers (lower case, as the spec writes them).
TRACEPARENT, TRACESTATE = "traceparent", "tracestate"
CONTEXT_HEADERS = frozenset({TRACEPARENT, TRACESTATE})

_tracer: Tracer | None = None
_provider: TracerProvider | None = None


class TracingUnavailable(RuntimeError):
    """Tracing is configured but OpenTelemetry is not installed."""


@final
class Credentials:
    """The headers that authenticate to a receiver, renewed in place while exporters send with them (a
    telemetry endpoint's secret replaced while the instance runs). Replaced whole, never edited, so a
    sender in another thread reads the old set or the new one. ``url``: they go to its origin only.
    """

    __slots__ = ("_headers", "_origin")

    def __init__(self, headers: Mapping[str, str], url: str) -> None:
        self._headers = dict(headers)
        self._origin = _origin(url)

    def current(self) -> dict[str, str]:
        return dict(self._headers)

    def belong(self, url: str) -> bool:
        """Whether ``url`` is on the receiver's origin (scheme, host and port), where they may go."""
        return _origin(url) == self._origin

    def renew(self, headers: Mapping[str, str]) -> bool:
        """Send with ``headers`` from now on; whether they differ from the current ones."""
        fresh = dict(headers)
        if fresh == self._headers:
            return False
        self._headers = fresh
        return True


@attrs.frozen
class OtlpTarget:
    """An OTLP/HTTP receiver of one signal: its whole URL, and the headers that authenticate to it
    (``credentials``: the current ones, renewed for a tenant's endpoint; ``headers``: those it had first).

    ``networks``: a tenant's endpoint, reached only at public addresses and in these networks
    (:mod:`nvcf_mono.contracts.egress`); None for the operator's own collector. ``proxy``: the operator's
    HTTP proxy a tenant's endpoint is reached through (None: directly).
    """

    url: str
    headers: Mapping[str, str] = attrs.field(factory=dict)
    networks: tuple[str, ...] | None = None
    proxy: str | None = None
    credentials: Credentials = attrs.field(
        default=attrs.Factory(lambda self: Credentials(self.headers, self.url), takes_self=True), eq=False, repr=False
    )

    def session(self) -> Any:
        """The ``requests`` session an exporter to this receiver uses (None: the exporter's own); it sends
        the current :attr:`credentials` with every request.
        """
        if self.networks is None:
            return None
        from nvcf_mono.contracts.egress import parse
        from nvcf_mono.egress_requests import checked_session

        return checked_session(parse(self.networks), self.proxy, credentials=self.credentials)

    @classmethod
    def at(cls, endpoint: str, signal: str) -> OtlpTarget:
        """The receiver of ``signal`` (traces, metrics, logs) of the collector whose base URL is ``endpoint``."""
        return cls(f"{endpoint.rstrip('/')}/v1/{signal}")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1  # never equal to a real one
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(parts.scheme)


def setup(
    targets: Sequence[OtlpTarget],
    service_name: str,
    *,
    sample: float = 1.0,
    export_delay: float = 1.0,
    resource: Mapping[str, str] | None = None,
) -> None:
    """Send this process's spans to each of ``targets`` (until :func:`shutdown`)."""
    global _tracer, _provider
    endpoint = ", ".join(t.url for t in targets)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as err:
        raise TracingUnavailable(
            f"tracing is configured ({endpoint}) but OpenTelemetry is not installed: pip install 'nvcf-mono[otel]'"
        ) from err
    shutdown()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, **(resource or {})}),
        sampler=ParentBased(TraceIdRatioBased(sample)),
    )
    for target in targets:
        exporter = OTLPSpanExporter(
            endpoint=target.url, headers=dict(target.headers), timeout=10, session=target.session()
        )
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=export_delay * 1000))
    _provider = provider
    _tracer = provider.get_tracer("nvcf_mono")


def shutdown() -> None:
    """Send what is left and stop tracing (blocks for at most the exporter's timeout)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def installed() -> bool:
    """Whether the ``otel`` extra is installed: the SDK, its OTLP/HTTP exporters and the OTLP protobuf types
    (looked up, not imported).
    """
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:  # no opentelemetry package at all
        return False


def enabled() -> bool:
    return _tracer is not None


def extract(headers: Iterable[tuple[str, str]] | Mapping[str, str]) -> Context | None:
    """The trace context a caller's (or the platform's) ``traceparent`` header names; None without one."""
    if _tracer is None:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    carrier = {k.lower(): v for k, v in pairs if k.lower() in CONTEXT_HEADERS}
    if TRACEPARENT not in carrier:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)


def start(name: str, *, parent: Context | Span | None = None, kind: str = "internal", **attributes: Any) -> Span | None:
    """A started span (not made current: hops hand contexts on explicitly); None when tracing is off."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.set_span_in_context(parent) if isinstance(parent, trace.Span) else parent
    return _tracer.start_span(name, context=context, kind=trace.SpanKind[kind.upper()], attributes=attributes)


def end(span: Span | None, *, error: str | None = None, **attributes: Any) -> None:
    """End ``span`` (nothing for None), marked failed with ``error``."""
    if span is None:
        return
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def headers_of(span: Span | None) -> list[tuple[str, str]]:
    """``traceparent`` (and ``tracestate``) naming ``span`` as the parent of what the receiver does."""
    if span is None:
        return []
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return list(carrier.items())


def replace_context(headers: Iterable[tuple[str, str]], span: Span | None) -> list[tuple[str, str]]:
    """``headers`` with their trace context replaced by ``span``'s (kept as they are without a span)."""
    if span is None:
        return list(headers)
    return [(k, v) for k, v in headers if k.lower() not in CONTEXT_HEADERS] + headers_of(span)
