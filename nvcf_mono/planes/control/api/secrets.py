"""``/v2/nvcf/secrets``: a function version's secrets and the account's own (sealed at rest, never returned).

An account's secrets reach every instance and task of the account, in the same ``SECRETS_FILE`` as the
function's (or task's) own secrets, which win where a name is in both.
"""

from __future__ import annotations

import json
from typing import Any

from nvcf_mono.auth import scopes as S
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import Call, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.function import FunctionStatus, FunctionVersion
from nvcf_mono.models.secret import SealedSecrets, SecretNames, SecretsRequest
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.service import not_found, open_secrets, owned_version, seal_secrets
from nvcf_mono.planes.control.validation import check_secrets
from nvcf_mono.structure import evolve

TAG = "secrets"
routes: Routes[Control] = Routes()
#: All of a version's secrets together, as JSON: kept well under the bus's message size limit.
MAX_TOTAL_BYTES = 512 * 1024


def merged(
    ctl: Control, key: str, current: SealedSecrets | None, given: dict[str, Any], *, whose: str
) -> SealedSecrets:
    """``given`` over the secrets sealed under ``key``, sealed again; 400 past :data:`MAX_TOTAL_BYTES`."""
    values = {} if current is None else open_secrets(ctl, key, current)
    values.update(given)
    if len(json.dumps(values, separators=(",", ":")).encode()) > MAX_TOTAL_BYTES:
        raise ProblemError(
            400,
            f"the {whose} secrets together would exceed {MAX_TOTAL_BYTES // 1024} KiB; use fewer or smaller secrets",
        )
    return seal_secrets(ctl, key, values)


@routes.route(
    "PUT",
    "/v2/nvcf/secrets/functions/{functionId}/versions/{versionId}",
    summary="Add or replace secrets of a function version (merged over the existing ones); 204.",
    tag=TAG,
    scopes=(S.UPDATE_SECRETS,),
    body=SecretsRequest,
    errors=(404,),
    cross_account=True,
    description="A version without secrets may get its first ones only while INACTIVE. "
    "Values are never returned by any endpoint; instances fetch them with their worker token.",
)
async def update_function_secrets(ctl: Control, call: Call[SecretsRequest]) -> None:
    if not call.body.secrets:
        raise ProblemError(400, "secrets must name at least one secret")
    given = check_secrets(call.body.secrets)
    fv = await owned_version(ctl, call)
    key = buckets.function_secrets_key(fv.id, fv.version_id)

    def merge(current: SealedSecrets | None) -> SealedSecrets:
        if current is None and fv.status is not FunctionStatus.INACTIVE:
            # Running instances fetched their secrets at start; a first set would reach only some.
            raise ProblemError(
                400,
                f"Function '{fv.id}' version '{fv.version_id}' has no secrets and is {fv.status.value}: "
                "secrets can be added to a version without any only while it is INACTIVE "
                "(undeploy it first, or create a new version with the secrets)",
            )
        return merged(ctl, key, current, given, whose="version's")

    sealed = await ctl.store.secrets.mutate(key, merge)
    assert sealed is not None
    names = sealed.names

    def rename(current: FunctionVersion | None) -> FunctionVersion | None:
        if current is None or current.secrets == names:
            raise Unchanged
        return evolve(current, secrets=names)

    if await ctl.store.functions.mutate(buckets.version_key(fv.id, fv.version_id), rename) is None:
        # Deleted meanwhile: its secrets must not outlive it.
        await ctl.store.secrets.mutate(key, lambda _: None)
        raise not_found(fv.id, fv.version_id)


ACCOUNT_SECRETS = "/v2/nvcf/secrets/account"
_ACCOUNT_DOC = (
    "Every instance and task of the account reads them in its SECRETS_FILE beside its own secrets (which win "
    "where a name is in both); running instances get changes within plugins.compute.local.secrets_refresh "
    "seconds on the local and containers backends, and within the cluster's kubernetes.secrets_refresh plus the "
    "kubelet's sync period on the Kubernetes backend, also instances that had no secrets when they started."
)


@routes.route(
    "PUT",
    ACCOUNT_SECRETS,
    summary="Add or replace the account's own secrets (merged over the existing ones); 204.",
    tag=TAG,
    scopes=(S.UPDATE_SECRETS,),
    body=SecretsRequest,
    cross_account=True,
    description=_ACCOUNT_DOC,
)
async def update_account_secrets(ctl: Control, call: Call[SecretsRequest]) -> None:
    if not call.body.secrets:
        raise ProblemError(400, "secrets must name at least one secret")
    given = check_secrets(call.body.secrets)
    key = buckets.account_secrets_key(call.account)
    await ctl.store.secrets.mutate(key, lambda current: merged(ctl, key, current, given, whose="account's"))


@routes.route(
    "GET",
    ACCOUNT_SECRETS,
    summary="The names of the account's own secrets (never their values).",
    tag=TAG,
    scopes=(S.UPDATE_SECRETS,),
    response=SecretNames,
    cross_account=True,
    description=_ACCOUNT_DOC,
)
async def list_account_secrets(ctl: Control, call: Call[None]) -> SecretNames:
    sealed = await ctl.store.secrets.fetch(buckets.account_secrets_key(call.account))
    return SecretNames(secrets=sealed.names if sealed is not None else ())


@routes.route(
    "DELETE",
    ACCOUNT_SECRETS + "/{secretName}",
    summary="Remove one of the account's secrets; 204, 404 when the account has no such secret.",
    tag=TAG,
    scopes=(S.UPDATE_SECRETS,),
    errors=(404,),
    cross_account=True,
)
async def delete_account_secret(ctl: Control, call: Call[None]) -> None:
    name, key = call.path("secretName"), buckets.account_secrets_key(call.account)

    def drop(current: SealedSecrets | None) -> SealedSecrets | None:
        values = {} if current is None else open_secrets(ctl, key, current)
        if name not in values:
            raise ProblemError(404, f"the account '{call.account}' has no secret named '{name}'")
        del values[name]
        return seal_secrets(ctl, key, values) if values else None

    await ctl.store.secrets.mutate(key, drop)
