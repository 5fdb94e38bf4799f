"""A function's or task's telemetry endpoints as the worker sends to them (``NVCF_TELEMETRY_EXPORTS``).

The worker stands in for NVCF's collector sidecar, over OTLP/HTTP: its spans of every invocation go
to the traces endpoint (through :mod:`nvcf_mono.tracing`), the instance's request count and
durations to the metrics endpoint, and its own log of the instance (health, failures) to the logs
endpoint. Everything here needs the ``otel`` extra; the entrypoint says so and serves without.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nvcf_mono.contracts import trace
from nvcf_mono.tracing import OtlpTarget

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk.metrics import MeterProvider

#: Seconds between sends of the instance's request metrics (and once more when the worker stops).
METRICS_INTERVAL = 30.0


class InstanceTelemetry:
    """The instance's request metrics and the worker's log records, sent to the workload's endpoints."""

    def __init__(self, metrics: OtlpTarget | None, logs: OtlpTarget | None, resource: Mapping[str, str]) -> None:
        from opentelemetry.sdk.resources import Resource

        self._resource = Resource.create(dict(resource))
        self._meters: MeterProvider | None = None
        self._loggers: LoggerProvider | None = None
        self._handler: LoggingHandler | None = None
        self._requests: Any = None
        self._duration: Any = None
        if metrics is not None:
            self._start_metrics(metrics)
        if logs is not None:
            self._start_logs(logs)

    def _start_metrics(self, target: OtlpTarget) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        exporter = OTLPMetricExporter(
            endpoint=target.url, headers=dict(target.headers), timeout=5, session=target.session()
        )
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=METRICS_INTERVAL * 1000)
        self._meters = MeterProvider(resource=self._resource, metric_readers=[reader])
        meter = self._meters.get_meter("nvcf_mono.worker")
        self._requests = meter.create_counter(
            trace.WORKER_REQUESTS, unit="{request}", description="Requests the instance answered or failed."
        )
        self._duration = meter.create_histogram(
            trace.WORKER_REQUEST_DURATION, unit="s", description="From a request's arrival to its last byte."
        )

    def _start_logs(self, target: OtlpTarget) -> None:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

        self._loggers = LoggerProvider(resource=self._resource)
        exporter = OTLPLogExporter(
            endpoint=target.url, headers=dict(target.headers), timeout=5, session=target.session()
        )
        self._loggers.add_log_record_processor(BatchLogRecordProcessor(exporter, schedule_delay_millis=1000))
        self._handler = LoggingHandler(level=logging.INFO, logger_provider=self._loggers)
        logging.getLogger("nvcf_mono").addHandler(self._handler)

    def record(self, seconds: float, status: int | None) -> None:
        """One request done: answered with ``status``, or failed here (None)."""
        if self._requests is None:
            return
        attributes: dict[str, Any] = (
            {"http.response.status_code": status} if status is not None else {trace.OUTCOME: "failed"}
        )
        self._requests.add(1, attributes)
        self._duration.record(seconds, attributes)

    def shutdown(self) -> None:
        """Send what is left and stop (blocks for at most the exporters' timeouts)."""
        if self._handler is not None:
            logging.getLogger("nvcf_mono").removeHandler(self._handler)
        for provider in (self._meters, self._loggers):
            if provider is not None:
                provider.shutdown()
