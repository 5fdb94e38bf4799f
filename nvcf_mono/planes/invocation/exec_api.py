"""``exec``: NVCF's JSON-wrapped invocation, re-issued as a pexec of the JSON ``requestBody``.

The answer wraps the function's: ``reqId``, ``status``, ``percentComplete``, ``errorCode`` (a status
other than 200/202/302), ``responseReference`` (a 302's ``Location``) and ``response`` (the JSON body
of a 200), with the function's HTTP status (302 becomes 200). Failures of the platform itself
(auth, bad input, a full queue) stay problem+json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from nvcf_mono.auth import scopes as S
from nvcf_mono.http.api import Call, Param, Routes, json_response
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.late import Late
from nvcf_mono.planes.invocation.answers import (
    PERCENT,
    POLL,
    QUEUE_POSITION,
    REQID,
    STATUS,
    WAIT_REASON,
    nvcf_status,
)
from nvcf_mono.planes.invocation.http import TAG, Invocation, Invoker
from nvcf_mono.planes.invocation.metrics import Observation
from nvcf_mono.structure import WireModel, checked, described, unstructure, wire

ExecStatus = Literal["errored", "in-progress", "fulfilled"]
#: exec and its status poll.
routes: Routes[Late[Invoker]] = Routes()
#: Headers of the inner answer the wrapper keeps (the function's own stay inside the JSON).
KEPT_HEADERS = (REQID, STATUS, PERCENT, WAIT_REASON, QUEUE_POSITION, "Server-Timing")


def _not_negative(value: int | None) -> str | None:
    return None if value is None or value >= 0 else "must be greater than or equal to 0"


@wire
class ExecRequestHeader(WireModel):
    """``requestHeader``: what pexec takes as headers."""

    input_asset_references: tuple[str, ...] = ()
    #: NVCF-POLL-SECONDS of exec: up to 3600 (plugins.invocation.max_poll_seconds, checked with NVCF's text when
    #: the request is handled); 0 waits the least there is, as NVCF clamps it; a negative number is no wait.
    poll_duration_seconds: int | None = checked(default=None, check=described(_not_negative, minimum=0, maximum=3600))


@wire
class ExecRequest(WireModel):
    """Body of ``POST /v2/nvcf/exec/functions/...``: ``requestBody`` is sent to the function as JSON."""

    request_body: Any
    request_header: ExecRequestHeader | None = None


@wire
class ExecResponse(WireModel):
    """The function's answer in NVCF's exec wrapper (nulls omitted)."""

    req_id: str
    status: ExecStatus
    response_reference: str | None = None
    percent_complete: int | None = None
    error_code: int | None = None
    response: Any = None
    #: Why a 202 is still waiting (``queued``, ``running``, ...) and where it is in its queue.
    wait_reason: str | None = None
    queue_position: int | None = None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def wrap(answer: web.StreamResponse) -> web.Response:
    """The exec JSON for a whole (unstreamed) pexec answer; a problem+json answer stays as it is."""
    if not isinstance(answer, web.Response):  # pragma: no cover - callers pass buffered answers
        raise ProblemError(500, "exec needs the whole response")
    status = answer.status
    request_id = answer.headers.get(REQID, "")
    body = answer.body if isinstance(answer.body, bytes) else b""
    percent = _int(answer.headers.get(PERCENT))
    http_status = status
    fields: dict[str, Any] = {"status": nvcf_status(status)}
    answered: msgspec.Raw | None = None
    if status == 200:
        try:
            # Checked to be JSON and passed on as the function wrote it: decoded, an answer of many small
            # objects took some 24 times its size and held the event loop.
            answered = msgspec.json.decode(body, type=msgspec.Raw)
        except (msgspec.DecodeError, RecursionError) as err:
            raise ProblemError(
                500,
                f"the function answered 200 with a body that is not JSON ({err}); exec needs JSON, pexec passes "
                "any body through",
                headers={REQID: request_id, STATUS: "errored"},
            ) from err
        fields["percent_complete"] = 100
    elif status == 302:
        fields["response_reference"] = answer.headers.get("Location")
        fields["percent_complete"] = 100
        http_status = 200
    elif status == 202:
        fields["percent_complete"] = percent
        fields["wait_reason"] = answer.headers.get(WAIT_REASON)
        fields["queue_position"] = _int(answer.headers.get(QUEUE_POSITION))
    else:
        fields["error_code"] = status
    doc = ExecResponse(req_id=request_id, **fields)
    if answered is None:
        response = json_response(doc, http_status)
    else:
        members = {**unstructure(doc, omit_none=True), "response": answered}
        response = web.Response(status=http_status, body=msgspec.json.encode(members), content_type="application/json")
    headers: CIMultiDict[str] = CIMultiDict()
    for name in KEPT_HEADERS:
        value = answer.headers.get(name)
        if value is not None:
            headers[name] = value
    response.headers.update(headers)
    return response


async def execute(late: Late[Invoker], call: Call[ExecRequest], version_id: str | None) -> web.StreamResponse:
    invoker = late.get()

    async def entry(obs: Observation) -> web.StreamResponse:
        fv = await invoker.routing.resolve_current(call.principal, call.path("functionId"), version_id)
        obs.target(fv, call.principal.account)
        header = call.body.request_header or ExecRequestHeader()
        poll = None
        if header.poll_duration_seconds is not None:
            if header.poll_duration_seconds > invoker.config.max_poll_seconds:
                raise ProblemError(
                    400, f"requestHeader.pollDurationSeconds must be <= {invoker.config.max_poll_seconds}"
                )
            poll = max(header.poll_duration_seconds, 1)
        asset_ids = await invoker.input_assets(
            call.principal, header.input_asset_references, source="requestHeader.inputAssetReferences"
        )
        headers = CIMultiDict(call.request.headers)
        headers.popall("Content-Length", None)
        headers["Content-Type"] = "application/json"
        body = json.dumps(call.body.request_body, separators=(",", ":")).encode()
        answer = await invoker.handle(
            call.request,
            call.principal,
            fv,
            Invocation(
                method="POST",
                path=fv.inference_url or "/",
                headers=headers,
                asset_ids=asset_ids,
                poll=poll,
                body=body,
                buffered=True,
            ),
        )
        return wrap(answer)

    return await invoker.observed(entry)


POLL_PARAM = Param(
    name=POLL, location="header", description="Seconds to wait for the result before a 202 (1-3600).",
    schema={"type": "integer", "minimum": 1, "maximum": 3600},
)  # fmt: skip
#: What exec's two invoking operations share.
EXEC_OPTIONS: Mapping[str, Any] = {
    "tag": TAG,
    "scopes": (S.INVOKE_FUNCTION,),
    "body": ExecRequest,
    "response": ExecResponse,
    "passthrough": True,
    "errors": (404, 409, 422, 429),
    "body_too_large": 400,  # past http.max_json_body (2 MiB), as NVCF's exec answers past its 2 MB
}


@routes.route(
    "POST",
    "/v2/nvcf/exec/functions/{functionId}",
    summary="Invoke any ACTIVE version of a function with a JSON body; the answer is wrapped in JSON.",
    **EXEC_OPTIONS,
)
async def exec_function(late: Late[Invoker], call: Call[ExecRequest]) -> web.StreamResponse:
    return await execute(late, call, None)


@routes.route(
    "POST",
    "/v2/nvcf/exec/functions/{functionId}/versions/{versionId}",
    summary="Invoke one version of a function with a JSON body; the answer is wrapped in JSON.",
    **EXEC_OPTIONS,
)
async def exec_function_version(late: Late[Invoker], call: Call[ExecRequest]) -> web.StreamResponse:
    return await execute(late, call, call.path("versionId"))


@routes.route(
    "GET",
    "/v2/nvcf/exec/status/{requestId}",
    summary="Poll an exec request that answered 202: its wrapped result (once), 202 while it runs.",
    head=False,  # a HEAD would take the result and drop it
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    response=ExecResponse,
    passthrough=True,
    params=(POLL_PARAM,),
    errors=(404,),
)
async def get_exec_request_status(late: Late[Invoker], call: Call[None]) -> web.StreamResponse:
    invoker = late.get()
    with invoker.held.hold(call.principal.account):  # a poll waits like a call: it counts as one in flight
        answer = await invoker.waiting.poll(call.request, call.principal, call.path("requestId"), buffered=True)
    return wrap(answer)
