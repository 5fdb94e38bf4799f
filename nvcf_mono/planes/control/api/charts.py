"""``/v1/validate`` and ``/v1/render``: NVCF's chart validator (ReVal) as an API (reference helm-validation §2).

A chart that breaks the rules is a 200 with ``valid: false`` and the errors; a malformed request a 400.
"""

from __future__ import annotations

from nvcf_mono.auth import scopes as S
from nvcf_mono.http.api import Call, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.control.context import Control
from nvcf_mono.reval.engine import RequestError, RevalRequest, RevalResult

TAG = "helm"
routes: Routes[Control] = Routes()


@routes.route(
    "POST",
    "/v1/validate",
    summary="Render a Helm chart and check it against the rules of Helm functions (valid, validationErrors).",
    tag=TAG,
    scopes=(S.REGISTER_FUNCTION,),
    body=RevalRequest,
    response=RevalResult,
)
async def validate(ctl: Control, call: Call[RevalRequest]) -> RevalResult:
    try:
        return await ctl.validator.validate(call.body)
    except RequestError as err:
        raise ProblemError(400, str(err)) from None


@routes.route(
    "POST",
    "/v1/render",
    summary="Validate a Helm chart and return its objects as they would be installed (sanitized).",
    tag=TAG,
    scopes=(S.REGISTER_FUNCTION,),
    body=RevalRequest,
    response=RevalResult,
)
async def render(ctl: Control, call: Call[RevalRequest]) -> RevalResult:
    try:
        return await ctl.validator.render(call.body)
    except RequestError as err:
        raise ProblemError(400, str(err)) from None
