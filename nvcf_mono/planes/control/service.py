"""Domain operations several endpoints share: finding what a caller may touch, secrets, undeploying."""

from __future__ import annotations

import json
from typing import Any

from nvcf_mono.auth.principal import Principal
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import Call
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.deployment import Deployment, GpuSpec
from nvcf_mono.models.function import FunctionStatus, FunctionVersion
from nvcf_mono.models.secret import SealedSecrets
from nvcf_mono.planes.control.access import Relation, relation, restricted_out
from nvcf_mono.planes.control.context import Control
from nvcf_mono.structure import evolve


def not_found(function_id: str, version_id: str | None = None) -> ProblemError:
    if version_id is None:
        return ProblemError(404, f"Function '{function_id}' not found")
    return ProblemError(404, f"Function '{function_id}' version '{version_id}' not found")


async def find_version(
    ctl: Control, principal: Principal, account: str, function_id: str, version_id: str, *, owner_only: bool = False
) -> tuple[FunctionVersion, Relation]:
    """The version if the caller may see it: 404 otherwise, 403 when only the key's resources exclude it."""
    fv = await ctl.store.functions.fetch(buckets.version_key(function_id, version_id))
    if fv is None:
        raise not_found(function_id, version_id)
    rel = relation(ctl.store, principal, account, fv)
    if rel is None:
        if restricted_out(principal, account, fv):
            raise ProblemError(403, "the API key does not grant access to this function version")
        raise not_found(function_id, version_id)
    if owner_only and rel != "owner":
        raise not_found(function_id, version_id)
    return fv, rel


async def owned_version(ctl: Control, call: Call[Any]) -> FunctionVersion:
    """The version the path names (``functionId``, ``versionId``), if the caller's account owns it: 404 otherwise."""
    fv, _ = await find_version(
        ctl, call.principal, call.account, call.path("functionId"), call.path("versionId"), owner_only=True
    )
    return fv


async def find_versions(
    ctl: Control, principal: Principal, account: str, function_id: str
) -> list[tuple[FunctionVersion, Relation]]:
    """Every version of a function the caller may see (one another control node made a moment ago
    included): 404 when there is none, 403 when only the key's resources exclude them.
    """
    versions = await ctl.store.versions_now(function_id)
    shown = [(fv, rel) for fv in versions if (rel := relation(ctl.store, principal, account, fv)) is not None]
    if not shown:
        if any(restricted_out(principal, account, fv) for fv in versions):
            raise ProblemError(403, "the API key does not grant access to any version of this function")
        raise not_found(function_id)
    return shown


def seal_secrets(ctl: Control, key: str, values: dict[str, Any]) -> SealedSecrets:
    """Secrets as stored: names in clear, values sealed together and bound to their key."""
    blob = json.dumps(values, separators=(",", ":")).encode()
    return SealedSecrets(names=tuple(sorted(values)), sealed=ctl.keyring.box.seal(blob, aad=key), updated_at=now_iso())


def open_secrets(ctl: Control, key: str, sealed: SealedSecrets) -> dict[str, Any]:
    values: dict[str, Any] = json.loads(ctl.keyring.box.open(sealed.sealed, aad=key))
    return values


def new_deployment(fv: FunctionVersion, specs: tuple[GpuSpec, ...]) -> Deployment:
    """A version's deployment as it is first stored: DEPLOYING, with these (checked) specifications."""
    now = now_iso()
    return Deployment(
        function_id=fv.id,
        function_version_id=fv.version_id,
        deployment_id=new_id(),
        function_name=fv.name,
        nca_id=fv.nca_id,
        function_status=FunctionStatus.DEPLOYING,
        created_at=now,
        last_updated_at=now,
        deployment_specifications=specs,
    )


async def set_status(
    ctl: Control, fv: FunctionVersion, status: FunctionStatus, *, expected: FunctionStatus | None = None
) -> FunctionVersion:
    """Write a version's status (CAS), keeping everything else as stored.

    With ``expected``, only a version still in that status changes: a reconciler working from a
    slightly old view never undoes what an API call just did (an undeploy, say).
    """

    def change(current: FunctionVersion | None) -> FunctionVersion | None:
        if current is None or current.status is status:
            raise Unchanged
        if expected is not None and current.status is not expected:
            raise Unchanged
        return evolve(current, status=status)

    updated = await ctl.store.functions.mutate(buckets.version_key(fv.id, fv.version_id), change)
    return updated or fv


async def forget_deployment(ctl: Control, dep: Deployment) -> None:
    """Remove this deployment (not one made since in its place) from the store."""

    def remove(current: Deployment | None) -> Deployment | None:
        if current is None or current.deployment_id != dep.deployment_id:
            raise Unchanged
        return None

    await ctl.store.deployments.mutate(buckets.version_key(dep.function_id, dep.function_version_id), remove)


async def undeploy(ctl: Control, fv: FunctionVersion, *, graceful: bool) -> FunctionVersion:
    """Remove the deployment; the reconciler terminates the instances. Graceful waits for the queue.

    A graceful undeploy keeps the deployment, marked ``undeploying``, until the reconciler sees the
    version's queue empty; the version reads INACTIVE at once either way, as NVCF answers.
    """
    key = buckets.version_key(fv.id, fv.version_id)
    if graceful:

        def mark(current: Deployment | None) -> Deployment | None:
            if current is None:
                raise Unchanged
            return evolve(current, undeploying=True, last_updated_at=now_iso())

        await ctl.store.deployments.mutate(key, mark)
    else:
        await ctl.store.deployments.mutate(key, lambda _: None)
    updated = await set_status(ctl, fv, FunctionStatus.INACTIVE)
    ctl.poke()
    return updated
