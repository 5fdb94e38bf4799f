"""``/v2/nvcf/stats``: the last hour of the caller's invocations, minute by minute (the console's charts).

From every invocation node's load reports (``planes/control/traffic.py``): invocations queued,
answers with an error status, and the answers' latency at p50 and p95. Only the caller's own
function versions count (a version shared with it is its owner's traffic).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from nvcf_mono.auth import scopes as S
from nvcf_mono.http.api import Call, Param, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.control import traffic
from nvcf_mono.planes.control.context import Control
from nvcf_mono.structure import WireModel, wire

TAG = "stats"
routes: Routes[Control] = Routes()


@wire
class TrafficPoint(WireModel):
    """One minute: ``at`` is its start (ISO 8601, UTC); latency in ms, absent without answers."""

    at: str
    invocations: int
    errors: int
    p50_ms: float | None = None
    p95_ms: float | None = None


@wire
class VersionTraffic(WireModel):
    function_id: str
    function_version_id: str
    function_name: str
    points: tuple[TrafficPoint, ...]


@wire
class TrafficResponse(WireModel):
    """``total`` sums ``versions`` (each version the caller owns that was invoked in the window)."""

    step_seconds: int
    total: tuple[TrafficPoint, ...]
    versions: tuple[VersionTraffic, ...]


def _points(ctl: Control, version_ids: list[str], now: float, count: int) -> tuple[TrafficPoint, ...]:
    return tuple(
        TrafficPoint(
            at=datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            invocations=traffic.invocations(counts),
            errors=traffic.errors(counts),
            p50_ms=_rounded(traffic.percentile(counts, 0.5)),
            p95_ms=_rounded(traffic.percentile(counts, 0.95)),
        )
        for start, counts in ctl.traffic.minutes(version_ids, now=now, count=count)
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@routes.route(
    "GET",
    "/v2/nvcf/stats",
    summary="The last hour of the caller's invocations per minute: count, errors, latency p50 and p95.",
    tag=TAG,
    scopes=(S.LIST_FUNCTIONS,),
    response=TrafficResponse,
    params=(
        Param(name="functionId", description="Only this function's versions."),
        Param(name="versionId", description="Only this version (with functionId)."),
        Param(
            name="minutes",
            description="How many minutes back, the current one included (1-60, default 60).",
            schema={"type": "integer", "minimum": 1, "maximum": 60},
        ),
    ),
    errors=(400, 404),
    cross_account=True,
)
async def get_stats(ctl: Control, call: Call[None]) -> TrafficResponse:
    count = call.query_int("minutes", traffic.KEEP, lo=1, hi=traffic.KEEP)
    function_id, version_id = call.query("functionId"), call.query("versionId")
    if version_id and not function_id:
        raise ProblemError(400, "versionId needs functionId")
    owned: list[FunctionVersion] = [
        fv
        for fv in ctl.store.functions.values()
        if fv.nca_id == call.account
        and (function_id is None or fv.id == function_id)
        and (version_id is None or fv.version_id == version_id)
    ]
    if function_id and not owned:
        raise ProblemError(404, f"function {function_id} was not found")
    now = time.time()
    versions = []
    for fv in sorted(owned, key=lambda f: (f.name, f.version_id)):
        points = _points(ctl, [fv.version_id], now, count)
        if function_id or any(p.invocations or p.errors or p.p50_ms is not None for p in points):
            versions.append(
                VersionTraffic(
                    function_id=fv.id, function_version_id=fv.version_id, function_name=fv.name, points=points
                )
            )
    return TrafficResponse(
        step_seconds=traffic.STEP,
        total=_points(ctl, [fv.version_id for fv in owned], now, count),
        versions=tuple(versions),
    )
