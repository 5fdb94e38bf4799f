"""``/v2/nvcf/accounts``: create, read, update and delete accounts, map JWT clients to them (super admin)."""

from __future__ import annotations

from typing import Any

from nvcf_mono.auth import scopes as S
from nvcf_mono.bus.errors import ConflictError
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import Call, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.account import (
    Account,
    AccountDeploymentsResponse,
    AccountListResponse,
    AccountRequest,
    AccountResponse,
    ClientsRequest,
    GpuUsage,
    GpuUsageResponse,
    account_id_problem,
)
from nvcf_mono.models.cluster import parse_instance_type
from nvcf_mono.models.common import now_iso
from nvcf_mono.models.deployment import GpuSpec
from nvcf_mono.models.function import FunctionStatus
from nvcf_mono.models.sharing import AuthorizedParties
from nvcf_mono.planes.control.catalog import candidates
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.views import deployment_view
from nvcf_mono.structure import evolve

TAG = "accounts"
routes: Routes[Control] = Routes()
ACCOUNTS = "/v2/nvcf/accounts"
# These routes name an account but act as the caller (account_from_path stays off): creating an
# account must reach its handler, and a malformed id deserves a 400, not the twins' 404.
ACCOUNT = "/v2/nvcf/accounts/{ncaId}"
LIMITS = (
    "max_functions_allowed",
    "max_tasks_allowed",
    "max_telemetries_allowed",
    "max_registry_credentials_allowed",
)


def account_id(call: Call[Any]) -> str:
    nca_id = call.path("ncaId")
    problem = account_id_problem(nca_id)
    if problem:
        raise ProblemError(400, f"Invalid account id {nca_id!r}: {problem}")
    return nca_id


async def existing(ctl: Control, call: Call[Any]) -> Account:
    nca_id = account_id(call)
    account = await ctl.store.accounts.fetch(nca_id)
    if account is None:
        raise ProblemError(404, f"Account '{nca_id}' not found")
    return account


def check_clients_free(ctl: Control, client_ids: tuple[str, ...], nca_id: str) -> None:
    """409 when another account already maps one of the client ids (a sub maps to one account)."""
    for account in ctl.store.accounts.values():
        if account.nca_id == nca_id:
            continue
        taken = sorted(set(client_ids) & set(account.admin_client_ids))
        if taken:
            raise ProblemError(
                409,
                f"Client id {taken[0]!r} is already associated with account '{account.nca_id}'; "
                "disassociate it there first",
            )


def limits(req: AccountRequest) -> dict[str, int]:
    return {name: value for name in LIMITS if (value := getattr(req, name)) is not None}


def refuse_registry_credentials(req: AccountRequest) -> None:
    if req.registry_credentials is not None:
        raise ProblemError(
            400,
            "'registryCredentials' is not supported on account setup: add them after creating the account "
            "with POST /v2/nvcf/accounts/<ncaId>/registry-credentials",
        )


@routes.route(
    "POST",
    ACCOUNT,
    summary="Create an account (name 4-36 characters; adminClientId maps a JWT sub to it).",
    tag=TAG,
    scopes=(S.ACCOUNT_SETUP,),
    body=AccountRequest,
    response=AccountResponse,
    errors=(409,),
)
async def create_account(ctl: Control, call: Call[AccountRequest]) -> AccountResponse:
    nca_id = account_id(call)
    req = call.body
    if req.name is None:
        raise ProblemError(
            400, "Validation failed: [object=accountRequest, field=name, rejected=null, message=must not be null]"
        )
    refuse_registry_credentials(req)
    clients = (req.admin_client_id,) if req.admin_client_id is not None else ()
    check_clients_free(ctl, clients, nca_id)
    account = Account(nca_id=nca_id, name=req.name, last_updated_at=now_iso(), admin_client_ids=clients, **limits(req))
    try:
        await ctl.store.accounts.create(nca_id, account)
    except ConflictError:
        raise ProblemError(409, f"Account '{nca_id}' already exists") from None
    return AccountResponse(account=account)


@routes.route(
    "GET",
    ACCOUNTS,
    summary="List every account.",
    tag=TAG,
    scopes=(S.ACCOUNT_SETUP,),
    response=AccountListResponse,
)
async def list_accounts(ctl: Control, call: Call[None]) -> AccountListResponse:
    return AccountListResponse(cloud_accounts=tuple(sorted(ctl.store.accounts.values(), key=lambda a: a.nca_id)))


@routes.route(
    "GET",
    ACCOUNT,
    summary="Read an account.",
    tag=TAG,
    scopes=(S.ACCOUNT_SETUP,),
    response=AccountResponse,
    errors=(404,),
)
async def get_account(ctl: Control, call: Call[None]) -> AccountResponse:
    return AccountResponse(account=await existing(ctl, call))


@routes.route(
    "PATCH",
    ACCOUNT,
    summary="Update an account's name or limits; adminClientId adds a JWT client to it.",
    tag=TAG,
    scopes=(S.ACCOUNT_SETUP,),
    body=AccountRequest,
    response=AccountResponse,
    errors=(404, 409),
)
async def update_account(ctl: Control, call: Call[AccountRequest]) -> AccountResponse:
    current = await existing(ctl, call)
    req = call.body
    refuse_registry_credentials(req)
    changes: dict[str, Any] = limits(req)
    if req.name is not None:
        changes["name"] = req.name
    if not changes and req.admin_client_id is None:
        raise ProblemError(
            400,
            "At least one of 'name', 'adminClientId', 'maxFunctionsAllowed', 'maxTasksAllowed', "
            "'maxTelemetriesAllowed' or 'maxRegistryCredentialsAllowed' must be specified",
        )
    if req.admin_client_id is not None:
        check_clients_free(ctl, (req.admin_client_id,), current.nca_id)

    def change(stored: Account | None) -> Account | None:
        if stored is None:
            raise ProblemError(404, f"Account '{current.nca_id}' not found")
        clients = stored.admin_client_ids
        if req.admin_client_id is not None and req.admin_client_id not in clients:
            clients = (*clients, req.admin_client_id)
        return evolve(stored, **changes, admin_client_ids=clients, last_updated_at=now_iso())

    updated = await ctl.store.accounts.mutate(current.nca_id, change)
    assert updated is not None
    return AccountResponse(account=updated)


@routes.route(
    "DELETE",
    ACCOUNT,
    summary="Delete an account with no function versions, its API keys, registry credentials and assets.",
    tag=TAG,
    scopes=(S.ACCOUNT_SETUP,),
    errors=(404,),
)
async def delete_account(ctl: Control, call: Call[None]) -> None:
    account = await existing(ctl, call)
    nca_id = account.nca_id
    if nca_id == ctl.config.default_account:
        raise ProblemError(400, f"The default account '{nca_id}' cannot be deleted")
    owned = sum(1 for fv in ctl.store.functions.values() if fv.nca_id == nca_id)
    if owned:
        raise ProblemError(
            400, f"Account '{nca_id}' still owns {owned} function version(s); delete them before the account"
        )
    await purge_account_data(ctl, nca_id)
    await ctl.store.accounts.delete(nca_id)


async def purge_account_data(ctl: Control, nca_id: str) -> None:
    """What the account owns besides functions, and the shares naming it, so a new one starts clean."""
    try:
        keys = ctl.keys
    except ProblemError:
        keys = None  # no API keys on this node (plugin auth_api_key off): none to revoke
    if keys is not None:
        for record in keys.list(nca_id=nca_id):
            await keys.revoke(record.id)
    await ctl.store.secrets.mutate(buckets.account_secrets_key(nca_id), lambda _: None)
    prefix = buckets.account_item_key(nca_id, "")
    for key, _ in ctl.store.registry_credentials.items():
        if key.startswith(prefix):
            await ctl.store.registry_credentials.mutate(key, lambda _: None)
    for key, _ in ctl.store.telemetries.items():
        if key.startswith(prefix):
            await ctl.store.telemetries.mutate(key, lambda _: None)
    if any(key.startswith(prefix) for key, _ in ctl.store.assets.items()):
        content = ctl.bus.objects(buckets.ASSET_CONTENT.name)
        for key, asset in ctl.store.assets.items():
            if key.startswith(prefix):
                await content.delete(buckets.asset_object(nca_id, asset.asset_id))
                await ctl.store.assets.mutate(key, lambda _: None)

    def unshare(current: AuthorizedParties | None) -> AuthorizedParties | None:
        if current is None or all(p.nca_id != nca_id for p in current.authorized_parties):
            raise Unchanged
        kept = tuple(p for p in current.authorized_parties if p.nca_id != nca_id)
        return evolve(current, authorized_parties=kept) if kept else None

    for key, parties in ctl.store.authorizations.items():
        if any(p.nca_id == nca_id for p in parties.authorized_parties):
            await ctl.store.authorizations.mutate(key, unshare)


@routes.route(
    "PATCH",
    f"{ACCOUNT}/clients/associate",
    summary="Map JWT client ids (sub) to the account; a client id belongs to at most one account.",
    tag=TAG,
    scopes=(S.ACCOUNT_SETUP,),
    body=ClientsRequest,
    response=AccountResponse,
    errors=(404, 409),
)
async def associate_clients(ctl: Control, call: Call[ClientsRequest]) -> AccountResponse:
    current = await existing(ctl, call)
    wanted = tuple(dict.fromkeys(call.body.client_ids))
    check_clients_free(ctl, wanted, current.nca_id)

    def change(stored: Account | None) -> Account | None:
        if stored is None:
            raise ProblemError(404, f"Account '{current.nca_id}' not found")
        added = tuple(c for c in wanted if c not in stored.admin_client_ids)
        if not added:
            raise Unchanged
        return evolve(stored, admin_client_ids=(*stored.admin_client_ids, *added), last_updated_at=now_iso())

    updated = await ctl.store.accounts.mutate(current.nca_id, change)
    assert updated is not None
    return AccountResponse(account=updated)


@routes.route(
    "PATCH",
    f"{ACCOUNT}/clients/disassociate",
    summary="Remove JWT client ids from the account.",
    tag=TAG,
    scopes=(S.ACCOUNT_SETUP,),
    body=ClientsRequest,
    response=AccountResponse,
    errors=(404,),
)
async def disassociate_clients(ctl: Control, call: Call[ClientsRequest]) -> AccountResponse:
    current = await existing(ctl, call)
    unwanted = set(call.body.client_ids)

    def change(stored: Account | None) -> Account | None:
        if stored is None:
            raise ProblemError(404, f"Account '{current.nca_id}' not found")
        unknown = sorted(unwanted - set(stored.admin_client_ids))
        if unknown:
            raise ProblemError(400, f"Client id {unknown[0]!r} is not associated with account '{stored.nca_id}'")
        kept = tuple(c for c in stored.admin_client_ids if c not in unwanted)
        return evolve(stored, admin_client_ids=kept, last_updated_at=now_iso())

    updated = await ctl.store.accounts.mutate(current.nca_id, change)
    assert updated is not None
    return AccountResponse(account=updated)


@routes.route(
    "GET",
    f"{ACCOUNT}/deployments",
    summary="List every deployment of an account (super admin).",
    tag=TAG,
    scopes=(f"admin:{S.DEPLOY_FUNCTION}",),
    response=AccountDeploymentsResponse,
    errors=(404,),
)
async def list_account_deployments(ctl: Control, call: Call[None]) -> AccountDeploymentsResponse:
    account = await existing(ctl, call)
    deployments = sorted(
        (d for d in ctl.store.deployments.values() if d.nca_id == account.nca_id),
        key=lambda d: (d.created_at, d.deployment_id),
    )
    return AccountDeploymentsResponse(deployments=tuple(deployment_view(ctl.store, d) for d in deployments))


def _gpus_per_instance(ctl: Control, spec: GpuSpec) -> int:
    """The instance type's GPUs: as a registered cluster lists it, else as its name says, else 1."""
    for _, it in candidates(ctl.store.clusters.values(), spec):
        return it.gpu_count
    parsed = parse_instance_type(spec.instance_type)
    return parsed.gpu_count if parsed is not None else 1


@routes.route(
    "GET",
    f"{ACCOUNT}/usage/gpus",
    summary="The GPUs an account's deployments may hold and the instances placed now, per GPU and instance "
    "type (super admin).",
    tag=TAG,
    scopes=(f"admin:{S.DEPLOY_FUNCTION}",),
    response=GpuUsageResponse,
    errors=(404,),
)
async def account_gpu_usage(ctl: Control, call: Call[None]) -> GpuUsageResponse:
    account = (await existing(ctl, call)).nca_id
    usage: dict[tuple[str, str], list[int]] = {}
    for dep in ctl.store.deployments.values():
        fv = ctl.store.functions.get(buckets.version_key(dep.function_id, dep.function_version_id))
        if dep.nca_id != account or fv is None or fv.status is FunctionStatus.INACTIVE:
            continue
        for spec in dep.deployment_specifications:
            each = _gpus_per_instance(ctl, spec)
            row = usage.setdefault((spec.gpu, spec.instance_type), [0, 0, 0])
            row[0] += spec.max_instances * each
            row[1] += spec.min_instances * each
    for ledger in ctl.store.placements.values():
        if ledger.nca_id != account:
            continue
        for inst in ledger.live():
            usage.setdefault((inst.gpu, inst.instance_type), [0, 0, 0])[2] += 1
    return GpuUsageResponse(
        gpus=tuple(
            GpuUsage(gpu=gpu, instance_type=it, current_max_usage=high, current_min_usage=low, placements=placed)
            for (gpu, it), (high, low, placed) in sorted(usage.items())
        )
    )
