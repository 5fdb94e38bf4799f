"""``/v2/nvcf/registry-credentials``: the account's registry logins (sealed at rest, never returned)."""

from __future__ import annotations

from typing import Any, TypeVar

from nvcf_mono.auth import scopes as S
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import Call, Param, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import is_uuid, new_id, now_iso
from nvcf_mono.models.secret import (
    AddRegistryCredentialRequest,
    ArtifactType,
    ProvisionedBy,
    RecognizedRegistriesByType,
    RecognizedRegistriesResponse,
    RegistryCredential,
    RegistryCredentialListResponse,
    RegistryCredentialResponse,
    SecretValue,
    StoredRegistryCredential,
    UpdateRegistryCredentialRequest,
)
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.registry import (
    NGC_HOSTNAME,
    RECOGNIZED,
    find_credential,
    hostname_problem,
    registry_name,
    secret_problem,
)
from nvcf_mono.planes.control.validation import SECRET_NAME
from nvcf_mono.structure import evolve

TAG = "registry-credentials"
routes: Routes[Control] = Routes()
BASE = "/v2/nvcf/registry-credentials"
SCOPES = (S.MANAGE_REGISTRY_CREDENTIALS,)


def check_secret(hostname: str, secret: SecretValue) -> None:
    if not SECRET_NAME.match(secret.name):
        raise ProblemError(
            400,
            f'invalid secret.name {secret.name!r}: must match "{SECRET_NAME.pattern}" (it names the credential)',
        )
    problem = secret_problem(hostname, secret.value)
    if problem:
        raise ProblemError(400, problem)


def seal(ctl: Control, key: str, secret: SecretValue) -> str:
    return ctl.keyring.box.seal(secret.value.strip().encode(), aad=key)


async def stored_or_404(ctl: Control, call: Call[Any]) -> tuple[str, StoredRegistryCredential]:
    cred_id = call.path("registryCredentialId")
    key = buckets.account_item_key(call.account, cred_id)
    stored = await ctl.store.registry_credentials.fetch(key) if is_uuid(cred_id) else None
    if stored is None:
        raise ProblemError(404, f"Registry credential '{cred_id}' not found in account '{call.account}'")
    return key, stored


@routes.route(
    "POST",
    BASE,
    summary="Add a registry credential (one per registry host name).",
    tag=TAG,
    scopes=SCOPES,
    body=AddRegistryCredentialRequest,
    response=RegistryCredentialResponse,
    errors=(404, 409),
    cross_account=True,
    description="secret.value is base64 of '<username>:<password>'; for NGC (nvcr.io) the username is "
    "$oauthtoken and the password an NGC API key. The secret is never returned.",
)
async def add_registry_credential(ctl: Control, call: Call[AddRegistryCredentialRequest]) -> RegistryCredentialResponse:
    req = call.body
    problem = hostname_problem(req.registry_hostname)
    if problem:
        raise ProblemError(400, problem)
    hostname = req.registry_hostname.strip().lower()
    check_secret(hostname, req.secret)
    account = await ctl.store.accounts.fetch(call.account)
    if account is None:
        raise ProblemError(404, f"account {call.account!r} not found")
    async with ctl.counted_creation:  # checked and made in one step: requests at once are seen in turn
        existing = find_credential(ctl.store, call.account, hostname)
        if existing is not None:
            cred = existing[1].credential
            raise ProblemError(
                409,
                f"a registry credential for '{cred.registry_hostname}' already exists "
                f"({cred.registry_credential_id}); update it with PATCH {BASE}/{cred.registry_credential_id}",
            )
        count = sum(1 for c in ctl.store.registry_credentials.values() if c.credential.nca_id == call.account)
        if count >= account.max_registry_credentials_allowed:
            raise ProblemError(
                400,
                "Reached or exceeded the max limit for the number of registry credentials allowed: "
                f"{account.max_registry_credentials_allowed}",
            )
        cred_id = new_id()
        key = buckets.account_item_key(call.account, cred_id)
        now = now_iso()
        cred = RegistryCredential(
            registry_credential_id=cred_id,
            nca_id=call.account,
            registry_credential_name=req.secret.name,
            registry_name=registry_name(hostname),
            registry_hostname=hostname,
            artifact_types=tuple(dict.fromkeys(req.artifact_types)),
            provisioned_by=ProvisionedBy.USER,
            created_at=now,
            last_updated_at=now,
            tags=req.tags,
            description=req.description,
        )
        await ctl.store.registry_credentials.create(
            key, StoredRegistryCredential(credential=cred, sealed_secret=seal(ctl, key, req.secret))
        )
    return RegistryCredentialResponse(registry_credential=cred)


@routes.route(
    "GET",
    BASE,
    summary="List the account's registry credentials.",
    tag=TAG,
    scopes=SCOPES,
    response=RegistryCredentialListResponse,
    params=(
        Param(name="artifactType", description="Only these artifact types (comma-separated or repeated)."),
        Param(name="provisionedBy", description="Only credentials added by USER or SYSTEM."),
    ),
    errors=(404,),
    cross_account=True,
)
async def list_registry_credentials(ctl: Control, call: Call[None]) -> RegistryCredentialListResponse:
    types = {_enum(ArtifactType, "artifactType", v) for v in call.query_list("artifactType")}
    by = {_enum(ProvisionedBy, "provisionedBy", v) for v in call.query_list("provisionedBy")}
    out = [
        stored.credential
        for stored in ctl.store.registry_credentials.values()
        if stored.credential.nca_id == call.account
        and (not types or types & set(stored.credential.artifact_types))
        and (not by or stored.credential.provisioned_by in by)
    ]
    out.sort(key=lambda c: (c.created_at, c.registry_credential_id))
    return RegistryCredentialListResponse(registry_credentials=tuple(out))


@routes.route(
    "GET",
    BASE + "/{registryCredentialId}",
    summary="Read a registry credential (never its secret).",
    tag=TAG,
    scopes=SCOPES,
    response=RegistryCredentialResponse,
    errors=(404,),
    cross_account=True,
)
async def get_registry_credential(ctl: Control, call: Call[None]) -> RegistryCredentialResponse:
    _, stored = await stored_or_404(ctl, call)
    return RegistryCredentialResponse(registry_credential=stored.credential)


@routes.route(
    "PATCH",
    BASE + "/{registryCredentialId}",
    summary="Replace a credential's secret and/or add artifact types (types are added, not replaced).",
    tag=TAG,
    scopes=SCOPES,
    body=UpdateRegistryCredentialRequest,
    response=RegistryCredentialResponse,
    errors=(404,),
    cross_account=True,
)
async def update_registry_credential(
    ctl: Control, call: Call[UpdateRegistryCredentialRequest]
) -> RegistryCredentialResponse:
    req = call.body
    if req.secret is None and req.artifact_type_enums is None:
        raise ProblemError(400, "At least one of 'secret' or 'artifactTypeEnums' must be specified")
    key, stored = await stored_or_404(ctl, call)
    if req.secret is not None:
        check_secret(stored.credential.registry_hostname, req.secret)

    def change(current: StoredRegistryCredential | None) -> StoredRegistryCredential:
        if current is None:
            raise ProblemError(404, f"Registry credential '{stored.credential.registry_credential_id}' not found")
        cred = current.credential
        types = cred.artifact_types + tuple(t for t in req.artifact_type_enums or () if t not in cred.artifact_types)
        cred = evolve(
            cred,
            artifact_types=types,
            registry_credential_name=req.secret.name if req.secret is not None else cred.registry_credential_name,
            last_updated_at=now_iso(),
        )
        sealed = seal(ctl, key, req.secret) if req.secret is not None else current.sealed_secret
        return StoredRegistryCredential(credential=cred, sealed_secret=sealed)

    updated = await ctl.store.registry_credentials.mutate(key, change)
    assert updated is not None
    return RegistryCredentialResponse(registry_credential=updated.credential)


@routes.route(
    "DELETE",
    BASE + "/{registryCredentialId}",
    summary="Delete a registry credential; 204.",
    tag=TAG,
    scopes=SCOPES,
    errors=(404,),
    cross_account=True,
)
async def delete_registry_credential(ctl: Control, call: Call[None]) -> None:
    key, stored = await stored_or_404(ctl, call)
    if stored.credential.provisioned_by is ProvisionedBy.SYSTEM:
        raise ProblemError(400, "a registry credential provisioned by the platform (SYSTEM) cannot be deleted")
    await ctl.store.registry_credentials.delete(key)


@routes.route(
    "GET",
    "/v2/nvcf/recognized-registries",
    summary="List the registries recognized by name, per artifact type.",
    tag=TAG,
    scopes=SCOPES,
    response=RecognizedRegistriesResponse,
    errors=(404,),
    cross_account=True,
    description="Credentials for other hosts may be added too; they are named by their host name.",
)
async def list_recognized_registries(ctl: Control, call: Call[None]) -> RecognizedRegistriesResponse:
    ngc = tuple(r for r in RECOGNIZED if r.hostname == NGC_HOSTNAME)
    return RecognizedRegistriesResponse(
        recognized_registries=RecognizedRegistriesByType(container=RECOGNIZED, helm=RECOGNIZED, model=ngc, resource=ngc)
    )


E = TypeVar("E", ArtifactType, ProvisionedBy)


def _enum(tp: type[E], name: str, raw: str) -> E:
    """A query value as an enum member (case-insensitive); 400 naming the choices otherwise."""
    for member in tp:
        if member.value.lower() == raw.lower():
            return member
    choices = ", ".join(m.value for m in tp)
    raise ProblemError(400, f"query parameter {name!r}: expected one of {choices}, got {raw!r}")
