"""Metric names follow Prometheus' conventions, except the names NVCF itself gives (kept as NVCF has them).

Counters end in ``_total``, histograms in ``_seconds`` (every histogram here measures time), nothing
starts with ``total_``. NVCF's invocation service names some series otherwise (reference:
invocation-plane §7, its dots turned into underscores); a client's dashboards for NVCF work here
because those names are kept.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nvcf_mono"
NVCF_NAMES = frozenset(
    {
        "function_request",
        "function_request_latency",
        "app_invocation_error",
        "nats_connects",
        "nats_event_disconnected",
        "nats_in_bytes",
        "nats_out_bytes",
        "nats_in_messages",
        "nats_out_messages",
        "total_nats_errors",
        "worker_thread_busy_seconds",
    }
)
DECLARED = re.compile(r"\.(counter|gauge|histogram)\(\s*\"([a-z_][a-z0-9_]*)\"")


def declared() -> list[tuple[str, str, str]]:
    """(kind, name, where) of every metric the package declares by a literal name."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for match in DECLARED.finditer(path.read_text()):
            found.append((match.group(1), match.group(2), str(path.relative_to(PACKAGE.parent))))
    return found


def test_metric_names_follow_the_conventions() -> None:
    metrics = declared()
    assert len(metrics) > 30, "the scan finds the declarations"
    assert {"function_request", "app_invocation_error", "worker_thread_busy_seconds"} <= {n for _, n, _ in metrics}
    wrong = [
        f"{where}: {kind} {name}"
        for kind, name, where in metrics
        if name not in NVCF_NAMES
        and (
            (kind == "counter" and not name.endswith("_total"))
            or (kind == "histogram" and not name.endswith("_seconds"))
            or name.startswith("total_")
        )
    ]
    assert wrong == [], "\n".join(wrong)
