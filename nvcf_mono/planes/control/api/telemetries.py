"""``/v2/nvcf/telemetries``: the account's telemetry endpoints (secrets sealed at rest, never returned)."""

from __future__ import annotations

from typing import Any

from nvcf_mono.auth import scopes as S
from nvcf_mono.contracts import buckets
from nvcf_mono.contracts.egress import parse
from nvcf_mono.http.api import Call, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.telemetry import (
    StoredTelemetry,
    Telemetry,
    TelemetryListResponse,
    TelemetryRequest,
    TelemetryResponse,
    TelemetrySecretRequest,
)
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.telemetry import (
    address_problem,
    endpoint_problem,
    export_problem,
    not_found,
    owned,
    provider_problem,
    seal_secret,
    secret_problem,
    users_of,
)
from nvcf_mono.structure import evolve

TAG = "telemetries"
routes: Routes[Control] = Routes()
BASE = "/v2/nvcf/telemetries"
SCOPES = (S.MANAGE_TELEMETRIES,)
EXPORT_NOTE = (
    "Telemetry goes out over OTLP/HTTP to <endpoint>/v1/traces, /v1/metrics and /v1/logs: the worker's "
    "spans of each invocation, the instance's request metrics and log, what the function prints (local and "
    "containers backends), and whatever the function's own "
    "OpenTelemetry SDK sends (its OTEL_EXPORTER_OTLP_* variables are set). Instances started from then "
    "on use a changed secret. The platform sends from its own side, so the endpoint must be at a public "
    "address or in a network its operator allows (plugins.control.telemetry_networks)."
)


async def _owned_or_404(ctl: Control, call: Call[Any]) -> tuple[str, StoredTelemetry]:
    tid = call.path("telemetryId")
    stored = await owned(ctl.store, call.account, tid)
    if stored is None:
        raise not_found(call.account, tid)
    return buckets.account_item_key(call.account, tid), stored


@routes.route(
    "POST",
    BASE,
    summary="Add a telemetry endpoint (its secret's name names it, unique in the account).",
    tag=TAG,
    scopes=SCOPES,
    body=TelemetryRequest,
    response=TelemetryResponse,
    errors=(404,),
    cross_account=True,
    description=EXPORT_NOTE,
)
async def create_telemetry(ctl: Control, call: Call[TelemetryRequest]) -> TelemetryResponse:
    req = call.body
    networks = parse(ctl.config.telemetry_networks)
    problem = (
        export_problem()
        or endpoint_problem(req.endpoint)
        or provider_problem(req.provider)
        or secret_problem(req.provider, req.secret)
        or await address_problem(req.endpoint, networks)
    )
    if problem:
        raise ProblemError(400, problem)
    account = await ctl.store.accounts.fetch(call.account)
    if account is None:
        raise ProblemError(404, f"account {call.account!r} not found")
    async with ctl.counted_creation:  # checked and made in one step: requests at once are seen in turn
        mine = [s.telemetry for s in ctl.store.telemetries.values() if s.nca_id == call.account]
        if len(mine) >= account.max_telemetries_allowed:
            raise ProblemError(
                400,
                f"Account '{call.account}': Cannot create telemetry - maximum allowed telemetries "
                f"({account.max_telemetries_allowed}) exceeded. Current count: {len(mine)}",
            )
        if any(t.name == req.secret.name for t in mine):
            raise ProblemError(
                400,
                f"Account '{call.account}': Telemetry and corresponding secret with name '{req.secret.name}' "
                "already exists in the account - Telemetries must have unique names within an account",
            )
        tid = new_id()
        key = buckets.account_item_key(call.account, tid)
        telemetry = Telemetry(
            telemetry_id=tid,
            name=req.secret.name,
            endpoint=req.endpoint.strip(),
            protocol=req.protocol,
            provider=req.provider,
            types=tuple(dict.fromkeys(req.types)),
            created_at=now_iso(),
        )
        stored = StoredTelemetry(
            telemetry=telemetry, nca_id=call.account, sealed_secret=seal_secret(ctl.keyring, key, req.secret)
        )
        await ctl.store.telemetries.create(key, stored)
    return TelemetryResponse(telemetry=telemetry)


@routes.route(
    "GET",
    BASE,
    summary="List the account's telemetry endpoints.",
    tag=TAG,
    scopes=SCOPES,
    response=TelemetryListResponse,
    errors=(404,),
    cross_account=True,
)
async def list_telemetries(ctl: Control, call: Call[None]) -> TelemetryListResponse:
    mine = [s.telemetry for s in ctl.store.telemetries.values() if s.nca_id == call.account]
    mine.sort(key=lambda t: (t.created_at, t.telemetry_id))
    return TelemetryListResponse(telemetries=tuple(mine))


@routes.route(
    "GET",
    BASE + "/{telemetryId}",
    summary="Read a telemetry endpoint (never its secret).",
    tag=TAG,
    scopes=SCOPES,
    response=TelemetryResponse,
    errors=(404,),
    cross_account=True,
)
async def get_telemetry(ctl: Control, call: Call[None]) -> TelemetryResponse:
    _, stored = await _owned_or_404(ctl, call)
    return TelemetryResponse(telemetry=stored.telemetry)


@routes.route(
    "DELETE",
    BASE + "/{telemetryId}",
    summary="Delete a telemetry endpoint; 204, or 400 while a function version or an unfinished task sends to it.",
    tag=TAG,
    scopes=SCOPES,
    errors=(404,),
    cross_account=True,
)
async def delete_telemetry(ctl: Control, call: Call[None]) -> None:
    key, stored = await _owned_or_404(ctl, call)
    tid = stored.telemetry.telemetry_id
    async with ctl.counted_creation:  # no version can start using it between the check and the delete
        users = users_of(ctl.store, call.account, tid)
        if users:
            raise ProblemError(
                400,
                "; ".join(
                    f"Telemetry '{tid}': Cannot be deleted as it is in use by {user} - Delete it (or let the task "
                    "finish) first to be able to delete the telemetry."
                    for user in users
                ),
            )
        await ctl.store.telemetries.delete(key)


@routes.route(
    "PUT",
    "/v2/nvcf/secrets/telemetries/{telemetryId}",
    summary="Replace a telemetry endpoint's secret; 204.",
    tag="secrets",
    scopes=(S.UPDATE_SECRETS,),
    body=TelemetrySecretRequest,
    errors=(404,),
    cross_account=True,
    description="secret.name must be the telemetry's name. " + EXPORT_NOTE,
)
async def update_telemetry_secret(ctl: Control, call: Call[TelemetrySecretRequest]) -> None:
    key, stored = await _owned_or_404(ctl, call)
    secret = call.body.secret
    tel = stored.telemetry
    if secret.name != tel.name:
        raise ProblemError(
            400,
            f"secret.name {secret.name!r} is not this telemetry's name: the secret of telemetry '{tel.telemetry_id}' "
            f"is named {tel.name!r}",
        )
    problem = secret_problem(tel.provider, secret)
    if problem:
        raise ProblemError(400, problem)

    def change(current: StoredTelemetry | None) -> StoredTelemetry:
        if current is None:
            raise not_found(call.account, tel.telemetry_id)
        return evolve(current, sealed_secret=seal_secret(ctl.keyring, key, secret))

    await ctl.store.telemetries.mutate(key, change)
