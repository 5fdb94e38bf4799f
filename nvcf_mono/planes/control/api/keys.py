"""``/v1/keys``: NVCF's API Keys service (snake_case JSON): mint, list, read and revoke ``nvapi-`` keys.

Only an admin credential (a JWT or the admin token) manages keys, and a key never grants more than
its creator holds: every scope must be held by the caller, and every resource reachable by it.
"""

from __future__ import annotations

import re
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web

from nvcf_mono.auth import scopes as S
from nvcf_mono.auth.apikeys import KeyFormatError
from nvcf_mono.auth.keystore import effective_status
from nvcf_mono.auth.principal import Principal, Resources
from nvcf_mono.auth.scopes import ALL_SCOPES
from nvcf_mono.http.api import Call, Param, Routes, json_response
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.account import account_id_problem
from nvcf_mono.models.api_key import (
    FUNCTIONS_SERVICE_ID,
    RESOURCE_TYPES,
    SERVICE_IDS,
    TASKS_SERVICE_ID,
    AdminKeyRequest,
    ApiKeyRecord,
    Authorizations,
    CreateKeyRequest,
    EvaluationRequest,
    EvaluationResponse,
    EvaluationResult,
    IntrospectRequest,
    IntrospectResponse,
    KeyDto,
    KeyListResponse,
    KeyResource,
    KeyStatus,
    Policy,
)
from nvcf_mono.models.common import iso, parse_iso, utc_now
from nvcf_mono.planes.control.access import shared_with
from nvcf_mono.planes.control.account_limits import one_more
from nvcf_mono.planes.control.context import Control

TAG = "api-keys"
routes: Routes[Control] = Routes()
DESCRIPTION_PATTERN = r"^[a-zA-Z0-9\s_-]{1,64}$"
_DESCRIPTION_RX = re.compile(r"[a-zA-Z0-9\s_-]{1,64}")
#: What NVCF's CLI asks for when no expiry is given.
DEFAULT_LIFETIME = timedelta(hours=24)
#: Principal kinds that may manage keys; an API key may not mint or revoke keys.
MANAGERS = frozenset({"admin_token", "jwt"})
KNOWN_SERVICES = frozenset(SERVICE_IDS.values())
#: The service an evaluation's namespace stands for (NVCF's ``apikeys.service-id-map``).
NAMESPACES = {"nvcf": FUNCTIONS_SERVICE_ID, "nvct": TASKS_SERVICE_ID}
_RULE = re.compile(r"[\w-]+\.allow")


def _span(seconds: float) -> str:
    if seconds % 86400 == 0:
        return f"{int(seconds // 86400)} days"
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)} hours"
    return f"{seconds:g} seconds"


def _resource_text(resource: KeyResource) -> str:
    return f"{resource.type}:{resource.id}"


def resource_problem(resource: KeyResource) -> str | None:
    """Why a requested resource entry is malformed, or None (the checker ignores malformed ones: refuse them)."""
    expected = RESOURCE_TYPES.get(resource.type)
    if expected is None:
        return f"unknown resource type {resource.type!r}; use one of {', '.join(RESOURCE_TYPES)}"
    if expected == "*":
        ok = resource.id == "*"
    elif resource.type == "function":
        parts = resource.id.split("/")
        ok = len(parts) == 2 and all(p and p.strip() == p for p in parts) and parts[0] != "*"
    else:
        ok = bool(resource.id.strip()) and "/" not in resource.id
    return None if ok else f"a resource of type {resource.type!r} takes the id {expected}, got {resource.id!r}"


def manager(call: Call[Any]) -> Principal:
    principal = call.principal
    if principal.kind not in MANAGERS:
        raise ProblemError(
            403,
            "API keys are managed with an admin credential (a JWT or the admin token); "
            "an API key cannot create, list, read or revoke keys",
        )
    return principal


async def target_account(ctl: Control, principal: Principal, requested: str | None) -> str:
    """The account acted for: the caller's own, or (super admins only) another existing one."""
    nca_id = principal.account if requested is None else requested
    if nca_id != principal.account:
        if not principal.super_admin:
            raise ProblemError(403, "Only a super admin may manage the API keys of another account")
        problem = account_id_problem(nca_id)
        if problem:
            raise ProblemError(400, f"Invalid nca_id {nca_id!r}: {problem}")
    if await ctl.store.accounts.fetch(nca_id) is None:
        raise ProblemError(404, f"Account '{nca_id}' not found")
    return nca_id


def visible(ctl: Control, principal: Principal, key_id: str) -> ApiKeyRecord:
    record = ctl.keys.find(key_id)
    if record is None or (record.nca_id != principal.account and not principal.super_admin):
        raise ProblemError(404, f"Key '{key_id}' not found")
    return record


def dto(record: ApiKeyRecord, *, value: str | None = None, details: bool) -> KeyDto:
    return KeyDto(
        id=record.id,
        status=effective_status(record),
        owner_type=record.owner_type,
        owner_id=record.owner_id,
        issuer_service_id=record.issuer_service_id,
        audience_service_ids=record.audience_service_ids,
        description=record.description,
        created_at=record.created_at,
        expires_at=record.expires_at,
        masked_key=record.masked,
        nca_id=record.nca_id,
        value=value,
        authorizations=record.authorizations if details else None,
    )


def expiry(ctl: Control, raw: str | None) -> datetime:
    now = utc_now()
    if raw is None:
        return now + DEFAULT_LIFETIME
    try:
        when = parse_iso(raw)
    except ValueError:
        raise ProblemError(
            400, f"'expires_at' must be an ISO-8601 timestamp such as 2030-01-31T12:00:00Z, got {raw!r}"
        ) from None
    if when <= now:
        raise ProblemError(400, f"'expires_at' must be in the future, got {raw!r} (now is {iso(now)})")
    longest = ctl.config.max_key_lifetime
    if when > now + timedelta(seconds=longest):
        raise ProblemError(
            400,
            f"'expires_at' must be at most {_span(longest)} from now "
            f"(at or before {iso(now + timedelta(seconds=longest))}), got {raw!r}",
        )
    return when


def normalized(authorizations: Authorizations) -> Authorizations:
    """Policies with their audiences filled in; 400 for empty or malformed ones."""
    if not authorizations.policies:
        raise ProblemError(400, "'authorizations.policies' must contain at least one policy with scopes")
    policies = []
    for index, policy in enumerate(authorizations.policies):
        where = f"authorizations.policies[{index}]"
        if not policy.scopes:
            raise ProblemError(400, f"'{where}.scopes' must name at least one scope")
        for resource in policy.resources:
            problem = resource_problem(resource)
            if problem:
                raise ProblemError(400, f"'{where}.resources': {problem}")
        service = SERVICE_IDS[policy.product]
        if policy.aud is not None and policy.aud != service:
            raise ProblemError(
                400,
                f"'{where}.aud' must be {service!r}, the service of product {policy.product.value!r}, "
                f"got {policy.aud!r}",
            )
        auds = policy.auds if policy.auds is not None else (service,)
        unknown = sorted(set(auds) - KNOWN_SERVICES)
        if not auds or unknown:
            raise ProblemError(
                400, f"'{where}.auds' must list service ids among {sorted(KNOWN_SERVICES)}, got {list(auds)}"
            )
        policies.append(
            Policy(
                scopes=tuple(dict.fromkeys(policy.scopes)),
                resources=tuple(dict.fromkeys(policy.resources)),
                product=policy.product,
                aud=service,
                auds=tuple(dict.fromkeys(auds)),
            )
        )
    return Authorizations(policies=tuple(policies))


def reachable(ctl: Control, nca_id: str, function_id: str, version_id: str) -> bool:
    """Is the function (version, or any version for ``*``) the account's own or shared with it?"""
    return any(
        fv.nca_id == nca_id or shared_with(ctl.store, fv.id, fv.version_id, nca_id)
        for fv in ctl.store.versions_of(function_id)
        if version_id in ("*", fv.version_id)
    )


def check_grantable(ctl: Control, principal: Principal, nca_id: str, authorizations: Authorizations) -> None:
    """400 for unknown scopes; 403 for scopes or resources the caller cannot give."""
    requested = list(dict.fromkeys(s for p in authorizations.policies for s in p.scopes))
    unknown = [s for s in requested if s not in ALL_SCOPES]
    if unknown:
        hint = " (name scopes without the 'apikey:' prefix)" if any(s.startswith("apikey:") for s in unknown) else ""
        raise ProblemError(400, f"Unknown scopes: {', '.join(unknown)}{hint}")
    missing = [s for s in requested if not principal.has(s)]
    if missing:
        raise ProblemError(403, f"Cannot grant scopes the caller does not hold: {', '.join(missing)}")
    uncovered = []
    for resource in dict.fromkeys(r for p in authorizations.policies for r in p.resources):
        wanted = Resources.from_entries([{"type": resource.type, "id": resource.id}])
        # None: the caller reaches the whole account, which still excludes other accounts' functions.
        held = principal.resources is None or principal.resources.covers(wanted)
        if resource.type == "function":
            function_id, version_id = resource.id.split("/")
            held = held and reachable(ctl, nca_id, function_id, version_id)
        if not held:
            uncovered.append(_resource_text(resource))
    if uncovered:
        raise ProblemError(
            403,
            f"Cannot grant resources the caller does not reach in account '{nca_id}': {', '.join(uncovered)}",
        )


def audiences(requested: tuple[str, ...] | None, authorizations: Authorizations) -> tuple[str, ...]:
    if requested is None:
        return tuple(dict.fromkeys(a for p in authorizations.policies for a in p.auds or ()))
    unknown = sorted(set(requested) - KNOWN_SERVICES)
    if not requested or unknown:
        raise ProblemError(
            400,
            f"'audience_service_ids' must list service ids among {sorted(KNOWN_SERVICES)}, got {list(requested)}",
        )
    return tuple(dict.fromkeys(requested))


@routes.route(
    "POST",
    "/v1/keys",
    summary="Create an API key (its value is shown only in this response); never more than the caller holds.",
    tag=TAG,
    body=CreateKeyRequest,
    response=KeyDto,
    errors=(404,),
)
async def create_key(ctl: Control, call: Call[CreateKeyRequest]) -> KeyDto:
    principal = manager(call)
    req = call.body
    nca_id = await target_account(ctl, principal, req.nca_id)
    if not _DESCRIPTION_RX.fullmatch(req.description):
        raise ProblemError(400, f"'description' must match {DESCRIPTION_PATTERN}, got {req.description!r}")
    expires_at = expiry(ctl, req.expires_at)
    authorizations = normalized(req.authorizations)
    audience_ids = audiences(req.audience_service_ids, authorizations)
    check_grantable(ctl, principal, nca_id, authorizations)
    async with _one_more_key(ctl, nca_id):
        record, value = await ctl.keys.create(
            nca_id=nca_id,
            owner_id=principal.subject,
            description=req.description,
            authorizations=authorizations,
            expires_at=expires_at,
            issuer_service_id=SERVICE_IDS[authorizations.policies[0].product],
            audience_service_ids=audience_ids,
        )
    return dto(record, value=value, details=True)


#: What ``POST /v1/admin/keys`` grants (NVCF's admin token scopes), on the account's functions.
ADMIN_KEY_SCOPES = (
    S.REGISTER_FUNCTION,
    S.LIST_FUNCTIONS,
    S.LIST_FUNCTIONS_DETAILS,
    S.DEPLOY_FUNCTION,
    S.UPDATE_FUNCTION,
    S.UPDATE_SECRETS,
    S.DELETE_FUNCTION,
    S.MANAGE_TELEMETRIES,
    S.MANAGE_REGISTRY_CREDENTIALS,
    S.CLUSTER_MANAGEMENT,
)
ADMIN_KEY_LIFETIME = timedelta(hours=12)


@routes.route(
    "POST",
    "/v1/admin/keys",
    summary="Mint a 12-hour key for managing the account's functions and clusters (NVCF's admin key); "
    "its value is shown only in this response.",
    description="Body {} (nca_id: another account, super admins only). The key holds register_function, "
    "list_functions, list_functions_details, deploy_function, update_function, update_secrets, "
    "delete_function, manage_telemetries, manage_registry_credentials and cluster-management on the "
    "account's functions; the caller must hold them all.",
    tag=TAG,
    body=AdminKeyRequest,
    body_optional=True,
    response=KeyDto,
    errors=(403, 404),
)
async def create_admin_key(ctl: Control, call: Call[AdminKeyRequest]) -> KeyDto:
    principal = manager(call)
    nca_id = await target_account(ctl, principal, call.body.nca_id)
    policy = Policy(scopes=ADMIN_KEY_SCOPES, resources=(KeyResource(id="*", type="account-functions"),))
    authorizations = normalized(Authorizations(policies=(policy,)))
    check_grantable(ctl, principal, nca_id, authorizations)
    async with _one_more_key(ctl, nca_id):
        record, value = await ctl.keys.create(
            nca_id=nca_id,
            owner_id=principal.subject,
            description="admin key",
            authorizations=authorizations,
            expires_in=ADMIN_KEY_LIFETIME,
            issuer_service_id=FUNCTIONS_SERVICE_ID,
            audience_service_ids=(FUNCTIONS_SERVICE_ID,),
        )
    return dto(record, value=value, details=True)


def _one_more_key(ctl: Control, nca_id: str) -> AbstractAsyncContextManager[None]:
    most = ctl.config.max_account_keys
    return one_more(
        ctl,
        count=lambda: sum(1 for r in ctl.keys.list(nca_id=nca_id) if effective_status(r) is KeyStatus.ACTIVE),
        most=most or None,
        refusal=f"the account holds {most} active API keys, the most it may (plugins.control.max_account_keys); "
        "revoke keys no longer needed",
    )


@routes.route(
    "GET",
    "/v1/keys",
    summary="List the account's API keys (without values or authorizations).",
    tag=TAG,
    response=KeyListResponse,
    params=(Param(name="nca_id", description="Another account's keys (super admin only)."),),
    errors=(404,),
)
async def list_keys(ctl: Control, call: Call[None]) -> KeyListResponse:
    principal = manager(call)
    nca_id = await target_account(ctl, principal, call.query("nca_id") or None)
    return KeyListResponse(keys=tuple(dto(r, details=False) for r in ctl.keys.list(nca_id=nca_id)))


@routes.route(
    "GET",
    "/v1/keys/{keyId}",
    summary="Read an API key with its authorizations (never its value).",
    tag=TAG,
    response=KeyDto,
    errors=(404,),
)
async def get_key(ctl: Control, call: Call[None]) -> KeyDto:
    return dto(visible(ctl, manager(call), call.path("keyId")), details=True)


@routes.route(
    "DELETE",
    "/v1/keys/{keyId}",
    summary="Revoke an API key: it stops working at once.",
    tag=TAG,
    errors=(404,),
)
async def delete_key(ctl: Control, call: Call[None]) -> None:
    record = visible(ctl, manager(call), call.path("keyId"))
    if not await ctl.keys.revoke(record.id):
        raise ProblemError(404, f"Key '{record.id}' not found")


@routes.route(
    "PUT",
    "/v1/keys/{keyId}/authorizations",
    summary="Replace an API key's authorizations (every node applies them to the key's next call); "
    "never more than the caller holds.",
    tag=TAG,
    body=Authorizations,
    response=KeyDto,
    errors=(404,),
)
async def update_key_authorizations(ctl: Control, call: Call[Authorizations]) -> KeyDto:
    principal = manager(call)
    record = visible(ctl, principal, call.path("keyId"))
    authorizations = normalized(call.body)
    foreign = sorted({str(p.aud) for p in authorizations.policies if p.aud not in record.audience_service_ids})
    if foreign:
        raise ProblemError(
            400,
            f"the policies name services the key is not for: {', '.join(foreign)} "
            f"(its audience_service_ids are {list(record.audience_service_ids)})",
        )
    check_grantable(ctl, principal, record.nca_id, authorizations)
    updated = await ctl.keys.update_authorizations(record.id, authorizations)
    if updated is None:
        raise ProblemError(404, f"Key '{record.id}' not found")
    return dto(updated, details=True)


def _active_record(ctl: Control, value: str) -> ApiKeyRecord | None:
    """The record of an active key's value; None for a value that is unknown, revoked, expired or suspended.

    Raises KeyFormatError for a value that is not a key of this platform.
    """
    record = ctl.keys.record_of(value)
    return record if record is not None and effective_status(record) is KeyStatus.ACTIVE else None


@routes.route(
    "POST",
    "/v1/introspect",
    summary="Who owns an API key and what it may do, for a service checking a key it was given.",
    description="Needs no bearer: the key itself is the credential asked about. 404 unless the key is active; "
    "400 when the service is not among the key's audiences.",
    tag=TAG,
    auth="none",
    body=IntrospectRequest,
    response=IntrospectResponse,
    errors=(400, 404),
)
async def introspect_key(ctl: Control, call: Call[IntrospectRequest]) -> IntrospectResponse:
    req = call.body
    if not req.key:
        raise ProblemError(400, "api key empty")
    try:
        record = _active_record(ctl, req.key)
    except KeyFormatError as err:
        raise ProblemError(400, f"api key format invalid: {err}") from None
    if record is None:
        raise ProblemError(404, "Key not found")
    if req.audience_service_id not in record.audience_service_ids:
        raise ProblemError(400, f"audience_service_id invalid: the key is for {list(record.audience_service_ids)}")
    return IntrospectResponse(
        owner_type=record.owner_type,
        owner_id=record.owner_id,
        key_id=record.id,
        issuer_service_id=record.issuer_service_id,
        authorizations=record.authorizations,
        nca_id=record.nca_id,
    )


@routes.route(
    "POST",
    "/v1/namespaces/{namespace}/evaluations/{rule}",
    summary="Whether an API key is allowed to call a service (namespace nvcf or nvct, rule <name>.allow).",
    description="Needs no bearer. Answers 200 with result.allowed false for a key that is malformed, unknown, "
    "revoked, expired, suspended or not for the namespace's service; an allowed key's result carries its "
    "account (ncaId), owner and the policy for that service. Cache-Control: max-age=60.",
    tag=TAG,
    auth="none",
    body=EvaluationRequest,
    response=EvaluationResponse,
    errors=(400,),
)
async def evaluate_key(ctl: Control, call: Call[EvaluationRequest]) -> web.Response:
    namespace, rule = call.path("namespace"), call.path("rule")
    audience = NAMESPACES.get(namespace)
    if audience is None:
        raise ProblemError(400, f"unknown namespace {namespace!r}: use one of {', '.join(NAMESPACES)}")
    if not _RULE.fullmatch(rule):
        raise ProblemError(400, f"the rule must be named <name>.allow, got {rule!r}")
    result = EvaluationResult(allowed=False)
    try:
        record = _active_record(ctl, call.body.input.api_key)
    except KeyFormatError:
        record = None
    if record is not None and audience in record.audience_service_ids:
        policy = next((p for p in record.authorizations.policies if p.aud == audience), None)
        result = EvaluationResult(allowed=True, nca_id=record.nca_id, owner_id=record.owner_id, policy=policy)
    response = json_response(EvaluationResponse(namespace=namespace, rule_name=rule, result=result))
    response.headers["Cache-Control"] = "max-age=60"
    return response
