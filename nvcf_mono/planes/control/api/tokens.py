"""``/v2/nvcf/tokens/functions``: delegation tokens, to let a client invoke a few functions for a while.

The token (:mod:`nvcf_mono.auth.delegation`) carries ``invoke_function`` on the named functions only,
for the caller's account, with the client id as the caller the function sees (``NVCF-SUB``). The
caller must be able to invoke each function itself; a token never reaches more than its minter.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from nvcf_mono.auth import scopes as S
from nvcf_mono.auth.delegation import KIND, MAX_FUNCTIONS
from nvcf_mono.http.api import Call, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.api_key import ApiKeyRecord
from nvcf_mono.models.common import is_uuid
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.service import find_version, find_versions
from nvcf_mono.structure import WireModel, wire

TAG = "tokens"
routes: Routes[Control] = Routes()
BASE = "/v2/nvcf/tokens/functions"
#: A client id travels to the function as a header value: printable ASCII, no spaces.
_CLIENT_RX = re.compile(r"[!-~]{1,128}")


@wire
class DelegationRequest(WireModel):
    """``{clientId}``: who the token is for."""

    client_id: str


@wire
class FunctionRef(WireModel):
    """One function a token may invoke; without a version, every version of it."""

    function_id: str
    function_version_id: str | None = None


@wire
class FunctionsDelegationRequest(WireModel):
    """``{functions: [{functionId, functionVersionId?}] (1-4), clientId}``."""

    functions: tuple[FunctionRef, ...]
    client_id: str


@attrs.frozen(kw_only=True)
class DelegationToken:
    """``{access_token, expires_in}`` (snake_case, as NVCF answers)."""

    access_token: str
    expires_in: int


async def _checked(ctl: Control, call: Call[Any], function_id: str, version_id: str | None) -> tuple[str, str | None]:
    """The function (version) if the caller may invoke it: 404 when it cannot see it, 403 when its key excludes it."""
    if not is_uuid(function_id):
        raise ProblemError(400, f"functionId {function_id!r} is not a function id (a UUID)")
    if version_id is not None:
        if not is_uuid(version_id):
            raise ProblemError(400, f"functionVersionId {version_id!r} is not a version id (a UUID)")
        await find_version(ctl, call.principal, call.account, function_id, version_id)
        return function_id, version_id
    await find_versions(ctl, call.principal, call.account, function_id)
    return function_id, None


async def _mint(ctl: Control, call: Call[Any], client_id: str, wanted: list[tuple[str, str | None]]) -> DelegationToken:
    minter = ctl.delegation  # 503 where the plugin is off
    principal = call.principal
    if principal.kind == KIND:
        raise ProblemError(403, "a delegation token cannot mint delegation tokens; ask its issuer for another")
    if not _CLIENT_RX.fullmatch(client_id):
        raise ProblemError(400, "clientId must be 1-128 printable ASCII characters without spaces")
    functions = [await _checked(ctl, call, fid, vid) for fid, vid in wanted]
    key: ApiKeyRecord | None = None
    if principal.key_id is not None:
        key = ctl.keys.find(principal.key_id)
        if key is None:
            raise ProblemError(401, "the API key has been revoked")
    token, ttl = minter.mint(principal, client_id=client_id, functions=functions, key=key)
    return DelegationToken(access_token=token, expires_in=ttl)


@routes.route(
    "POST",
    BASE + "/{functionId}",
    summary="A delegation token that may invoke every version of one function.",
    description="The token (a bearer, valid expires_in seconds) holds invoke_function on this function only, "
    "for the caller's account; the function sees clientId as its caller (NVCF-SUB). A token an API key "
    "minted stops working when the key is revoked, expires or has its authorizations changed.",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    body=DelegationRequest,
    response=DelegationToken,
    errors=(400, 403, 404, 503),
)
async def function_token(ctl: Control, call: Call[DelegationRequest]) -> DelegationToken:
    return await _mint(ctl, call, call.body.client_id, [(call.path("functionId"), None)])


@routes.route(
    "POST",
    BASE + "/{functionId}/versions/{versionId}",
    summary="A delegation token that may invoke one function version.",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    body=DelegationRequest,
    response=DelegationToken,
    errors=(400, 403, 404, 503),
)
async def version_token(ctl: Control, call: Call[DelegationRequest]) -> DelegationToken:
    return await _mint(ctl, call, call.body.client_id, [(call.path("functionId"), call.path("versionId"))])


@routes.route(
    "POST",
    BASE,
    summary=f"A delegation token that may invoke up to {MAX_FUNCTIONS} functions (or versions).",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    body=FunctionsDelegationRequest,
    response=DelegationToken,
    errors=(400, 403, 404, 503),
)
async def functions_token(ctl: Control, call: Call[FunctionsDelegationRequest]) -> DelegationToken:
    refs = call.body.functions
    if not 1 <= len(refs) <= MAX_FUNCTIONS:
        raise ProblemError(400, f"functions must name 1 to {MAX_FUNCTIONS} functions, got {len(refs)}")
    return await _mint(ctl, call, call.body.client_id, [(r.function_id, r.function_version_id) for r in refs])
