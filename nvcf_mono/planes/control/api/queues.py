"""``/v2/nvcf/queues``: how many requests wait for a function version, and where one request stands.

The waiting requests are the messages of the version's request stream (``rq_<region>_<fvid>``)
that the workers' durable has not handed out yet; the invocation plane records each request's
version and state in the ``nvcf_requests`` bucket.
"""

from __future__ import annotations

from nvcf_mono.auth import scopes as S
from nvcf_mono.bus.api import Stream
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import BusError, NotFound
from nvcf_mono.contracts import buckets, subjects
from nvcf_mono.http.api import Call, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import is_uuid
from nvcf_mono.models.function import FunctionStatus, FunctionVersion
from nvcf_mono.models.wait_reason import wait_reason
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.service import find_version, find_versions, not_found
from nvcf_mono.structure import WireModel, wire

TAG = "queues"
routes: Routes[Control] = Routes()
#: NVCF reports positions up to this.
MAX_POSITION = 1000


@wire
class VersionQueue(WireModel):
    """The queue of one function version."""

    function_version_id: str
    function_name: str
    function_status: FunctionStatus
    queue_depth: int
    #: While requests wait: why (queued, cold_starting, no_capacity or instance_failing), as their
    #: ``NVCF-WAIT-REASON`` says.
    wait_reason: str | None = None


@wire
class QueueDetails(WireModel):
    """``{functionId, queues}``."""

    function_id: str
    queues: tuple[VersionQueue, ...]


@wire
class QueuePosition(WireModel):
    """``{functionId, functionVersionId, positionInQueue}`` (1 is next; capped at 1000)."""

    function_id: str
    function_version_id: str
    position_in_queue: int


def _unavailable(err: BusError) -> ProblemError:
    return ProblemError(503, f"the request queues cannot be read now: {err}", headers={"Retry-After": "1"})


async def _delivered_seq(stream: Stream, durable: str) -> int:
    """The last stream sequence the workers' durable has handed out (0 before it exists)."""
    try:
        return (await stream.consumer_info(durable)).delivered_stream_seq
    except NotFound:
        return 0


def request_records(ctl: Control) -> TypedKV[buckets.RequestRecord]:
    return TypedKV(ctl.bus.kv(buckets.REQUESTS.name), buckets.REQUEST)


async def depth(ctl: Control, fv: FunctionVersion) -> int:
    """Requests not yet handed to a worker (0 before the version's stream exists)."""
    stream = ctl.bus.stream(subjects.request_stream(ctl.region, fv.version_id))
    try:
        return (await stream.consumer_info(subjects.worker_durable(ctl.region, fv.version_id))).num_pending
    except NotFound:
        pass
    except BusError as err:
        raise _unavailable(err) from err
    try:
        # The stream exists but no worker durable yet: every stored request is waiting.
        return (await stream.info()).messages
    except NotFound:
        return 0
    except BusError as err:
        raise _unavailable(err) from err


async def queue(ctl: Control, fv: FunctionVersion) -> VersionQueue:
    waiting = await depth(ctl, fv)
    return VersionQueue(
        function_version_id=fv.version_id,
        function_name=fv.name,
        function_status=fv.status,
        queue_depth=waiting,
        wait_reason=wait_reason(ctl.store.placements_of(fv.version_id)) if waiting else None,
    )


@routes.route(
    "GET",
    "/v2/nvcf/queues/functions/{functionId}",
    summary="Queue depth of every version of a function the caller can see.",
    tag=TAG,
    scopes=(S.QUEUE_DETAILS,),
    response=QueueDetails,
    errors=(404, 503),
    cross_account=True,
)
async def get_function_queues(ctl: Control, call: Call[None]) -> QueueDetails:
    function_id = call.path("functionId")
    if not is_uuid(function_id):
        raise not_found(function_id)
    shown = await find_versions(ctl, call.principal, call.account, function_id)
    return QueueDetails(function_id=function_id, queues=tuple([await queue(ctl, fv) for fv, _ in shown]))


@routes.route(
    "GET",
    "/v2/nvcf/queues/functions/{functionId}/versions/{versionId}",
    summary="Queue depth of one function version.",
    tag=TAG,
    scopes=(S.QUEUE_DETAILS,),
    response=QueueDetails,
    errors=(404, 503),
    cross_account=True,
)
async def get_function_version_queue(ctl: Control, call: Call[None]) -> QueueDetails:
    function_id, version_id = call.path("functionId"), call.path("versionId")
    if not (is_uuid(function_id) and is_uuid(version_id)):
        raise not_found(function_id, version_id)
    fv, _ = await find_version(ctl, call.principal, call.account, function_id, version_id)
    return QueueDetails(function_id=fv.id, queues=(await queue(ctl, fv),))


@routes.route(
    "GET",
    "/v2/nvcf/queues/{requestId}/position",
    summary="Where a queued request stands: 1 is next (capped at 1000).",
    tag=TAG,
    scopes=(S.QUEUE_DETAILS,),
    response=QueuePosition,
    errors=(404, 503),
    cross_account=True,
)
async def get_request_queue_position(ctl: Control, call: Call[None]) -> QueuePosition:
    request_id = call.path("requestId")
    gone = ProblemError(404, f"Request '{request_id}' is not queued (unknown, or already picked up or done)")
    if not is_uuid(request_id):
        raise gone
    try:
        stored = await request_records(ctl).get(request_id)
    except NotFound:
        stored = None  # the invocation plane has not created the bucket: no request was ever made
    except BusError as err:
        raise _unavailable(err) from err
    if stored is None:
        raise gone
    record = stored.value
    try:
        await find_version(ctl, call.principal, call.account, record.function_id, record.function_version_id)
    except ProblemError:
        raise gone from None  # a request of a function the caller cannot see is not theirs to know of
    if record.state != "queued":
        raise gone
    fvid = record.function_version_id
    stream = ctl.bus.stream(subjects.request_stream(record.region, fvid))
    try:
        msg = await stream.get_last(subjects.request_subject(record.region, fvid, request_id))
        if msg is None:
            raise gone
        delivered = await _delivered_seq(stream, subjects.worker_durable(record.region, fvid))
        if msg.seq <= delivered:
            raise gone  # handed to a worker already
        ahead = await stream.count_stored(delivered + 1, msg.seq - 1)
    except NotFound:
        raise gone from None
    except BusError as err:
        raise _unavailable(err) from err
    return QueuePosition(
        function_id=record.function_id,
        function_version_id=fvid,
        position_in_queue=min(1 + ahead, MAX_POSITION),
    )
