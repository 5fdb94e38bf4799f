"""A small Prometheus registry: counters, gauges and histograms with labels, and the text exposition.

Kept in-house so the hot path pays one dict lookup per observation and the package needs no extra
dependency. Names follow Prometheus conventions; the exposition is format 0.0.4.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, final

import attrs

from nvcf_mono.errors import NvcfMonoError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Latency buckets in seconds, from sub-millisecond (the platform's own overhead) to minutes.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)

LabelValues = tuple[str, ...]


class MetricError(NvcfMonoError):
    """A metric was declared twice with different shapes, or used with the wrong labels."""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _labels_text(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


@attrs.define
class _Metric:
    name: str
    help: str
    label_names: tuple[str, ...]

    kind = "untyped"

    def _key(self, labels: dict[str, str]) -> LabelValues:
        # Several observations per invocation: no sets built on the way (same size, every name found).
        names = self.label_names
        if len(labels) == len(names):
            try:
                return tuple([str(labels[n]) for n in names])
            except KeyError:
                pass
        raise MetricError(f"{self.name} takes labels {names}, got {tuple(labels)}")

    def _stored(self) -> dict[LabelValues, Any]:  # pragma: no cover - overridden
        return {}

    def forget(self, **labels: str) -> None:
        """Drop every series whose labels include ``labels``: what a deleted object left behind.

        Series are kept for what exists, not for everything that ever did.
        """
        unknown = set(labels) - set(self.label_names)
        if unknown:
            raise MetricError(f"{self.name} has no labels {sorted(unknown)}")
        where = [(self.label_names.index(name), str(value)) for name, value in labels.items()]
        stored = self._stored()
        for key in [key for key in stored if all(key[i] == value for i, value in where)]:
            del stored[key]

    def samples(self) -> Iterable[str]:  # pragma: no cover - overridden
        return ()

    def render(self) -> str:
        head = f"# HELP {self.name} {_escape(self.help)}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(line + "\n" for line in self.samples())


@attrs.define
class _Scalar(_Metric):
    """One number per series: stored, or read from a callback at every scrape."""

    _values: dict[LabelValues, float] = attrs.field(factory=dict, init=False)
    _callback: Callable[[], Iterable[tuple[LabelValues, float]]] | None = attrs.field(default=None, init=False)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` (default 1) to the series named by ``labels``."""
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def _stored(self) -> dict[LabelValues, float]:
        return self._values

    def value(self, **labels: str) -> float:
        """Current value of one series (0 when never set)."""
        return self._values.get(self._key(labels), 0.0)

    def set_function(self, fn: Callable[[], Iterable[tuple[LabelValues, float]]]) -> None:
        """Read the series from ``fn`` at every scrape instead of storing them."""
        self._callback = fn

    def samples(self) -> Iterable[str]:
        items = list(self._callback()) if self._callback is not None else sorted(self._values.items())
        if not self.label_names and not items:
            yield f"{self.name} 0"
        for key, value in items:
            yield f"{self.name}{_labels_text(self.label_names, key)} {_format_value(value)}"


@final
@attrs.define
class Counter(_Scalar):
    """A monotonically increasing count (incremented here, or a total another library keeps)."""

    kind = "counter"


@final
@attrs.define
class Gauge(_Scalar):
    """A value that goes up and down, set directly or read from a callback at scrape time."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        """Set the series named by ``labels``."""
        self._values[self._key(labels)] = value


@attrs.define
class _HistogramSeries:
    counts: list[int]
    total: float = 0.0
    count: int = 0


@final
@attrs.define
class Histogram(_Metric):
    """Observations counted into cumulative buckets."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    _series: dict[LabelValues, _HistogramSeries] = attrs.field(factory=dict, init=False)
    kind = "histogram"

    def observe(self, value: float, **labels: str) -> None:
        """Record one observation in the series named by ``labels``."""
        key = self._key(labels)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _HistogramSeries(counts=[0] * (len(self.buckets) + 1))
        series.counts[bisect.bisect_left(self.buckets, value)] += 1
        series.total += value
        series.count += 1

    def _stored(self) -> dict[LabelValues, _HistogramSeries]:
        return self._series

    def count(self, **labels: str) -> int:
        """Number of observations in one series."""
        series = self._series.get(self._key(labels))
        return 0 if series is None else series.count

    def samples(self) -> Iterable[str]:
        for key, series in sorted(self._series.items()):
            running = 0
            for bound, n in zip((*self.buckets, math.inf), series.counts, strict=True):
                running += n
                le = f'le="{_format_value(bound)}"'
                yield f"{self.name}_bucket{_labels_text(self.label_names, key, le)} {running}"
            yield f"{self.name}_sum{_labels_text(self.label_names, key)} {_format_value(series.total)}"
            yield f"{self.name}_count{_labels_text(self.label_names, key)} {series.count}"


M = TypeVar("M", bound=_Metric)


@final
@attrs.define
class Metrics:
    """One registry per host; plugins declare their metrics in ``setup()``."""

    _metrics: dict[str, _Metric] = attrs.field(factory=dict, init=False)

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        """Declare (or fetch the identical) counter ``name``."""
        return self._declare(Counter, name, help, tuple(labels))

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        """Declare (or fetch the identical) gauge ``name``."""
        return self._declare(Gauge, name, help, tuple(labels))

    def histogram(
        self, name: str, help: str, labels: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> Histogram:
        """Declare (or fetch the identical) histogram ``name``."""
        metric = self._declare(Histogram, name, help, tuple(labels))
        if metric.buckets != tuple(buckets):
            if metric._series:
                raise MetricError(f"histogram {name} already declared with other buckets")
            metric.buckets = tuple(sorted(buckets))
        return metric

    def _declare(self, kind: type[M], name: str, help: str, labels: tuple[str, ...]) -> M:
        existing = self._metrics.get(name)
        if existing is not None:
            if type(existing) is not kind or existing.label_names != labels:
                raise MetricError(
                    f"metric {name} already declared as {existing.kind} with labels {existing.label_names}"
                )
            return existing
        metric = kind(name=name, help=help, label_names=labels)
        self._metrics[name] = metric
        return metric

    def forget(self, **labels: str) -> None:
        """Drop, from every metric labelled with all of ``labels``, the series that carry them."""
        for metric in self._metrics.values():
            if set(labels) <= set(metric.label_names):
                metric.forget(**labels)

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        return "".join(m.render() for _, m in sorted(self._metrics.items()))
