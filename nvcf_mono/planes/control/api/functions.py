"""``/v2/nvcf/functions``: register, version, list, read, update metadata, delete."""

from __future__ import annotations

from nvcf_mono.auth import scopes as S
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import Call, Param, Routes, alias
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.function import (
    ApiBodyFormat,
    CreateFunctionRequest,
    FunctionIdsResponse,
    FunctionListResponse,
    FunctionResponse,
    FunctionStatus,
    FunctionType,
    FunctionVersion,
    UpdateFunctionRequest,
)
from nvcf_mono.planes.control.access import relation
from nvcf_mono.planes.control.charts import check_chart
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.service import (
    find_version,
    find_versions,
    not_found,
    owned_version,
    seal_secrets,
    undeploy,
)
from nvcf_mono.planes.control.telemetry import check_chosen
from nvcf_mono.planes.control.validation import (
    check_create_function,
    check_rate_limit,
    check_secrets,
    refuse_unsupported,
)
from nvcf_mono.planes.control.views import function_view
from nvcf_mono.structure import evolve

TAG = "functions"
routes: Routes[Control] = Routes()
VISIBILITIES = ("authorized", "private", "public")
LIST_SCOPES = (S.LIST_FUNCTIONS, S.LIST_FUNCTIONS_DETAILS)


async def new_version(ctl: Control, call: Call[CreateFunctionRequest], function_id: str | None) -> FunctionResponse:
    req = call.body
    check_create_function(req, allow_local_charts=ctl.config.helm.allow_local_charts)
    store = ctl.store
    if req.helm_chart is not None and ctl.config.helm.enabled:
        await check_chart(
            ctl.validator,
            chart=req.helm_chart,
            service_name=req.helm_chart_service_name,
            service_port=req.inference_port,
            configuration=None,
            account=(store, ctl.keyring, call.account),
            what=f"helmChart {req.helm_chart!r}",
        )
    secrets = check_secrets(req.secrets)
    async with ctl.counted_creation:  # counted and made in one step: requests at once cannot pass a limit together
        account = await store.accounts.fetch(call.account)
        if account is None:
            raise ProblemError(404, f"account {call.account!r} not found")
        versions = [fv for fv in store.functions.values() if fv.nca_id == call.account]
        most = ctl.config.max_account_versions
        if most and len(versions) >= most:
            raise ProblemError(
                400,
                f"Reached or exceeded the max limit for the number of function versions allowed: {most} "
                "(plugins.control.max_account_versions, over all the account's functions); delete versions "
                "no longer needed",
            )
        if function_id is None:
            owned = {fv.id for fv in versions}
            if len(owned) >= account.max_functions_allowed:
                raise ProblemError(
                    400,
                    "Reached or exceeded the max limit for the number of functions allowed: "
                    f"{account.max_functions_allowed}",
                )
            function_id = new_id()
        else:
            siblings = [fv for fv in await store.versions_now(function_id) if fv.nca_id == call.account]
            if not siblings:
                raise not_found(function_id)
        await check_chosen(store, call.account, req.telemetries)
        version_id = new_id()
        key = buckets.version_key(function_id, version_id)
        if secrets:
            await store.secrets.put(
                buckets.function_secrets_key(function_id, version_id),
                seal_secrets(ctl, buckets.function_secrets_key(function_id, version_id), secrets),
            )
        fv = FunctionVersion(
            id=function_id,
            nca_id=call.account,
            version_id=version_id,
            name=req.name,
            status=FunctionStatus.INACTIVE,
            created_at=now_iso(),
            inference_url=req.inference_url,
            inference_port=req.inference_port,
            container_image=req.container_image,
            container_args=req.container_args,
            container_environment=req.container_environment,
            helm_chart=req.helm_chart,
            helm_chart_service_name=req.helm_chart_service_name,
            health=req.health,
            health_uri=req.health_uri,
            api_body_format=req.api_body_format or ApiBodyFormat.CUSTOM,
            function_type=req.function_type or FunctionType.DEFAULT,
            description=req.description if req.description is not None else req.name,
            tags=req.tags,
            secrets=tuple(sorted(secrets)) if secrets else None,
            rate_limit=req.rate_limit,
            telemetries=req.telemetries,
        )
        await store.functions.create(key, fv)
    return FunctionResponse(function=function_view(store, fv, owner=True, details=True, include_secrets=True))


@routes.route(
    "POST",
    "/v2/nvcf/functions",
    summary="Register a function (its first version); status INACTIVE.",
    tag=TAG,
    scopes=(S.REGISTER_FUNCTION,),
    body=CreateFunctionRequest,
    response=FunctionResponse,
    errors=(404,),
    cross_account=True,
)
async def create_function(ctl: Control, call: Call[CreateFunctionRequest]) -> FunctionResponse:
    return await new_version(ctl, call, None)


@routes.route(
    "POST",
    "/v2/nvcf/functions/{functionId}/versions",
    summary="Register a new version of a function.",
    tag=TAG,
    scopes=(S.REGISTER_FUNCTION,),
    body=CreateFunctionRequest,
    response=FunctionResponse,
    errors=(404,),
    cross_account=True,
)
async def create_function_version(ctl: Control, call: Call[CreateFunctionRequest]) -> FunctionResponse:
    return await new_version(ctl, call, call.path("functionId"))


def visible(ctl: Control, call: Call[None]) -> list[FunctionVersion]:
    wanted = call.query_list("visibility") or ["authorized", "private"]
    unknown = [v for v in wanted if v.lower() not in VISIBILITIES]
    if unknown:
        raise ProblemError(400, f"unknown visibility {unknown[0]!r}: use authorized, private or public")
    lowered = {v.lower() for v in wanted}
    out = []
    for fv in ctl.store.functions.values():
        rel = relation(ctl.store, call.principal, call.account, fv)
        if (rel == "owner" and "private" in lowered) or (rel == "shared" and "authorized" in lowered):
            out.append(fv)
    return sorted(out, key=lambda fv: (fv.created_at, fv.version_id))


VISIBILITY = Param(
    name="visibility",
    description="Comma-separated: private (own), authorized (shared with you), public. Default: private,authorized.",
)


@routes.route(
    "GET",
    "/v2/nvcf/functions",
    summary="List every function version the caller can see.",
    tag=TAG,
    scopes=LIST_SCOPES,
    response=FunctionListResponse,
    params=(VISIBILITY,),
    cross_account=True,
)
async def list_functions(ctl: Control, call: Call[None]) -> FunctionListResponse:
    details = call.principal.has(S.LIST_FUNCTIONS_DETAILS)
    return FunctionListResponse(
        functions=tuple(
            function_view(ctl.store, fv, owner=fv.nca_id == call.account, details=details, include_secrets=False)
            for fv in visible(ctl, call)
        )
    )


@routes.route(
    "GET",
    "/v2/nvcf/functions/ids",
    summary="List the ids of the functions the caller can see.",
    tag=TAG,
    scopes=LIST_SCOPES,
    response=FunctionIdsResponse,
    params=(VISIBILITY,),
    cross_account=True,
)
async def list_function_ids(ctl: Control, call: Call[None]) -> FunctionIdsResponse:
    return FunctionIdsResponse(function_ids=tuple(dict.fromkeys(fv.id for fv in visible(ctl, call))))


@routes.route(
    "GET",
    "/v2/nvcf/functions/{functionId}/versions",
    summary="List the versions of a function.",
    tag=TAG,
    scopes=LIST_SCOPES,
    response=FunctionListResponse,
    errors=(404,),
    cross_account=True,
)
async def list_function_versions(ctl: Control, call: Call[None]) -> FunctionListResponse:
    details = call.principal.has(S.LIST_FUNCTIONS_DETAILS)
    visible = await find_versions(ctl, call.principal, call.account, call.path("functionId"))
    return FunctionListResponse(
        functions=tuple(
            function_view(ctl.store, fv, owner=rel == "owner", details=details, include_secrets=False)
            for fv, rel in visible
        )
    )


@routes.route(
    "GET",
    "/v2/nvcf/functions/{functionId}/versions/{versionId}",
    summary="Read a function version (instances and secret names need list_functions_details).",
    tag=TAG,
    scopes=LIST_SCOPES,
    response=FunctionResponse,
    params=(
        Param(
            name="includeSecrets",
            description="Include the names of the version's secrets (never their values); the owner's, with "
            "list_functions_details.",
            schema={"type": "boolean", "default": True},
        ),
    ),
    errors=(404,),
    cross_account=True,
)
async def get_function_version(ctl: Control, call: Call[None]) -> FunctionResponse:
    fv, rel = await find_version(ctl, call.principal, call.account, call.path("functionId"), call.path("versionId"))
    details = call.principal.has(S.LIST_FUNCTIONS_DETAILS) or (
        call.cross_account and call.principal.has("admin:list_functions_details")
    )
    include_secrets = call.query_bool("includeSecrets", default=True)  # NVCF's default: names only, never values
    view = function_view(ctl.store, fv, owner=rel == "owner", details=details, include_secrets=include_secrets)
    return FunctionResponse(function=view)


async def update_function(ctl: Control, call: Call[UpdateFunctionRequest]) -> FunctionResponse:
    req = call.body
    refuse_unsupported((("modelUpdates", req.model_updates), ("llmInvocationConfig", req.llm_invocation_config)))
    if req.tags is None and req.rate_limit is None and req.description is None:
        raise ProblemError(400, "At least one of 'tags', 'rateLimit' or 'description' must be specified")
    check_rate_limit(req.rate_limit)
    fv = await owned_version(ctl, call)

    def change(current: FunctionVersion | None) -> FunctionVersion | None:
        if current is None:
            raise not_found(fv.id, fv.version_id)
        return evolve(
            current,
            tags=req.tags if req.tags is not None else current.tags,
            rate_limit=req.rate_limit if req.rate_limit is not None else current.rate_limit,
            description=req.description if req.description is not None else current.description,
        )

    updated = await ctl.store.functions.mutate(buckets.version_key(fv.id, fv.version_id), change)
    assert updated is not None
    return FunctionResponse(function=function_view(ctl.store, updated, owner=True, details=True, include_secrets=False))


for path, deprecated in (
    ("/v2/nvcf/functions/{functionId}/versions/{versionId}", False),
    ("/v2/nvcf/metadata/functions/{functionId}/versions/{versionId}", True),
):
    routes.route(
        "PUT",
        path,
        summary="Update a version's metadata: tags, rate limit (replaced whole), description.",
        tag=TAG,
        scopes=(S.UPDATE_FUNCTION,),
        body=UpdateFunctionRequest,
        response=FunctionResponse,
        errors=(404,),
        cross_account=True,
        deprecated=deprecated,
    )(update_function if not deprecated else alias(update_function, "update_function_metadata"))


@routes.route(
    "DELETE",
    "/v2/nvcf/functions/{functionId}/versions/{versionId}",
    summary="Delete a version, with its deployment (instances stop at once) and secrets.",
    tag=TAG,
    scopes=(S.DELETE_FUNCTION,),
    errors=(404,),
    cross_account=True,
)
async def delete_function_version(ctl: Control, call: Call[None]) -> None:
    fv = await owned_version(ctl, call)
    store = ctl.store
    if store.deployments.get(buckets.version_key(fv.id, fv.version_id)) is not None:
        await undeploy(ctl, fv, graceful=False)
    await store.secrets.mutate(buckets.function_secrets_key(fv.id, fv.version_id), lambda _: None)
    await store.authorizations.mutate(f"{fv.id}.{fv.version_id}", lambda _: None)
    await store.functions.delete(buckets.version_key(fv.id, fv.version_id))
    if not store.versions_of(fv.id):
        await store.authorizations.mutate(fv.id, lambda _: None)
    ctl.poke()


@routes.route(
    "DELETE",
    "/v2/nvcf/ratelimit/functions/{functionId}/versions/{versionId}",
    summary="Remove a version's rate limit.",
    tag=TAG,
    scopes=(S.UPDATE_FUNCTION,),
    errors=(404,),
    cross_account=True,
)
async def delete_rate_limit(ctl: Control, call: Call[None]) -> None:
    fv = await owned_version(ctl, call)

    def change(current: FunctionVersion | None) -> FunctionVersion | None:
        if current is None or current.rate_limit is None:
            raise Unchanged
        return evolve(current, rate_limit=None)

    await ctl.store.functions.mutate(buckets.version_key(fv.id, fv.version_id), change)
