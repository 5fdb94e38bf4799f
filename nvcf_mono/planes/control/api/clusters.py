"""Clusters as users see them: cluster groups (backends), the ICMS GPU and instance-type listings,
and ICMS cluster registration and management.

Agents register their clusters over the bus (``icms.py``); an operator may also register one over
REST first (source ``api``), and the agent that later registers with that cluster id fills in its
inventory while what the operator set is kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from nvcf_mono.auth import scopes as S
from nvcf_mono.bus.errors import ConflictError
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.http.api import Call, Param, Routes, alias
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.cluster import (
    CloudProvider,
    Cluster,
    ClusterGpu,
    ClusterHeartbeat,
    GpuUsage,
    InstanceType,
    parse_instance_type,
)
from nvcf_mono.models.common import int_range, max_items, max_len, name_check, new_id, now_iso
from nvcf_mono.models.placement import LIVE
from nvcf_mono.planes.control.catalog import health_of, placeable, visible_clusters
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.icms import group_id
from nvcf_mono.structure import Check, WireModel, checked, evolve, wire

TAG_GROUPS = "cluster groups"
TAG_ICMS = "clusters (ICMS)"
routes: Routes[Control] = Routes()
CAPABILITIES = (
    "CachingSupport",
    "MiniServiceRestrictions",
    "HelmMiniService",
    "MultipleGPUTypesAllowed",
    "UniformInstanceLabels",
    "DynamicGPUDiscovery",
)
_CLUSTER_ID_RX = re.compile(r"[-_=A-Za-z0-9]{1,128}")
_REGION_RX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MANAGE_READ_SCOPES = (S.CLUSTER_MANAGEMENT, S.CLUSTER_LISTING)


def _region_check(value: str | None) -> str | None:
    if value is None or _REGION_RX.match(value):
        return None
    return "must be 1 to 64 letters, digits, '-' or '_' (e.g. us-west-1)"


def _strings(limit: int, length: int) -> Check:
    """A list of at most ``limit`` non-blank strings of at most ``length`` characters."""
    too_many = max_items(limit)

    def check(values: tuple[str, ...] | None) -> str | None:
        if values is None:
            return None
        problem = too_many(values)
        if problem:
            return problem
        for value in values:
            if not value.strip() or len(value) > length:
                return f"each value must be 1 to {length} characters, got {value!r}"
        return None

    return check


def _capabilities_check(values: tuple[str, ...] | None) -> str | None:
    known = {c.lower() for c in CAPABILITIES}
    for value in values or ():
        if value.lower() not in known:
            return f"unknown capability {value!r}: use {', '.join(CAPABILITIES)}"
    return None


def _canonical_capabilities(values: Iterable[str]) -> tuple[str, ...]:
    by_lower = {c.lower(): c for c in CAPABILITIES}
    return tuple(dict.fromkeys(by_lower[v.lower()] for v in values))


# ---- /v2/nvcf/clusterGroups ------------------------------------------------------------------------


@wire
class GroupInstanceType(WireModel):
    """An instance type offered in a cluster group."""

    name: str
    value: str
    description: str
    default: bool


@wire
class GroupGpu(WireModel):
    """A GPU offered in a cluster group, with its instance types."""

    name: str
    instance_types: tuple[GroupInstanceType, ...]


@wire
class GroupCluster(WireModel):
    """A cluster of a group."""

    id: str
    name: str
    k8s_version: str | None = None


@wire
class ClusterGroup(WireModel):
    """A cluster group; its ``name`` is what a deployment names as ``backend``."""

    id: str
    name: str
    nca_id: str
    authorized_nca_ids: tuple[str, ...]
    gpus: tuple[GroupGpu, ...]
    clusters: tuple[GroupCluster, ...]


@wire
class ClusterGroupsResponse(WireModel):
    """``{clusterGroups}``."""

    cluster_groups: tuple[ClusterGroup, ...]


# ---- ICMS listings ---------------------------------------------------------------------------------


@wire
class InstanceTypeDetails(WireModel):
    """An instance type of a GPU across the ready clusters that offer it."""

    name: str
    value: str
    description: str
    gpu_count: int
    clusters: tuple[str, ...]
    regions: tuple[str, ...]
    attributes: tuple[str, ...]
    cpu_cores: int | None = None
    system_memory: str | None = None
    gpu_memory: str | None = None
    cpu_arch: str | None = None
    os: str | None = None
    driver_version: str | None = None
    storage: str | None = None


@wire
class GpuListing(WireModel):
    """``{gpus}``: GPU names."""

    gpus: tuple[str, ...]


@wire
class RegionListing(WireModel):
    """``{regions}``: region names (lowercase)."""

    regions: tuple[str, ...]


@wire
class ClusterNameListing(WireModel):
    """``{clusterNames}``."""

    cluster_names: tuple[str, ...]


@wire
class AttributeListing(WireModel):
    """``{attributes}``: cluster attributes."""

    attributes: tuple[str, ...]


# ---- ICMS cluster management -----------------------------------------------------------------------


@wire
class InstanceTypeSpec(WireModel):
    """An instance type in a REST registration (the agent reports the real inventory later)."""

    name: str = checked(check=max_len(128))
    value: str | None = checked(None, check=max_len(128))
    gpu_count: int | None = checked(None, check=int_range(1, 64))
    description: str | None = checked(None, check=max_len(256))
    default: bool = False
    cpu_cores: int | None = checked(None, check=int_range(1, 100_000))
    system_memory: str | None = checked(None, check=max_len(32))
    gpu_memory: str | None = checked(None, check=max_len(32))
    cpu_arch: str | None = checked(None, check=max_len(32))
    os: str | None = checked(None, check=max_len(64))
    driver_version: str | None = checked(None, check=max_len(64))
    storage: str | None = checked(None, check=max_len(32))


@wire
class GpuSpecInput(WireModel):
    """A GPU in a REST registration."""

    name: str = checked(check=max_len(64))
    capacity: int = checked(0, check=int_range(0, 1_000_000))
    instance_types: tuple[InstanceTypeSpec, ...] = checked((), check=max_items(64))


@wire
class RegisterClusterRequest(WireModel):
    """Body of ``POST /v1/accounts/{ncaId}/clusters``."""

    cluster_name: str = checked(check=name_check)
    cluster_group_name: str = checked(check=name_check)
    nca_id: str = checked(check=max_len(128))
    cloud_provider: CloudProvider
    nvca_version: str = checked(check=max_len(64))
    region: str = checked(check=_region_check)
    authorized_nca_ids: tuple[str, ...] = checked((), check=_strings(256, 128), key="authorizedNCAIds")
    capabilities: tuple[str, ...] = checked((), check=_capabilities_check)
    attributes: tuple[str, ...] = checked((), check=_strings(64, 128))
    gpus: tuple[GpuSpecInput, ...] = checked((), check=max_items(32))


@wire
class RegisteredCluster(WireModel):
    """``{clusterId, clusterGroupId}``."""

    cluster_id: str
    cluster_group_id: str


@wire
class UpdateClusterRequest(WireModel):
    """Body of ``PUT /v1/accounts/{ncaId}/clusters/{clusterId}``: the fields to change."""

    cluster_group_name: str | None = checked(None, check=lambda v: None if v is None else name_check(v))
    authorized_nca_ids: tuple[str, ...] | None = checked(None, check=_strings(256, 128), key="authorizedNCAIds")
    attributes: tuple[str, ...] | None = checked(None, check=_strings(64, 128))
    capabilities: tuple[str, ...] | None = checked(None, check=_capabilities_check)
    region: str | None = checked(None, check=_region_check)


@wire
class ClusterView(WireModel):
    """A registered cluster with its health: ``status`` healthy/unhealthy from the agent's heartbeats, and
    ``maintenanceMode`` (``CordonOnly``: it takes no new instances) while its agent is heard.
    """

    cluster_id: str
    cluster_name: str
    cluster_group_name: str
    cluster_group_id: str
    nca_id: str
    authorized_nca_ids: tuple[str, ...] = checked(key="authorizedNCAIds")
    cloud_provider: str
    region: str
    capabilities: tuple[str, ...]
    attributes: tuple[str, ...]
    gpus: tuple[ClusterGpu, ...]
    nvca_version: str
    cluster_source: str
    status: str
    registered_at: str
    maintenance_mode: str | None = None
    nvca_last_connected: str | None = None
    k8s_version: str | None = None
    gpu_usage: dict[str, GpuUsage] | None = None


@wire
class ClusterListResponse(WireModel):
    """``{clusters}``."""

    clusters: tuple[ClusterView, ...]


# ---- helpers ---------------------------------------------------------------------------------------


def describe(gpu: str, it: InstanceType) -> str:
    """The instance type's description, or one made from its shape (``2x H100``)."""
    if it.description:
        return it.description
    parsed = parse_instance_type(it.name)
    per_node = parsed.gpus_per_node if parsed else it.gpu_count
    nodes = parsed.nodes if parsed else it.nodes
    text = f"{per_node}x {gpu}"
    return text if nodes <= 1 else f"{text} on each of {nodes} nodes"


def cluster_groups(clusters: Iterable[Cluster]) -> tuple[ClusterGroup, ...]:
    """Clusters grouped by group name, GPUs and instance types merged across a group's clusters."""
    by_group: dict[str, list[Cluster]] = {}
    for cluster in sorted(clusters, key=lambda c: (c.cluster_name.lower(), c.cluster_id)):
        by_group.setdefault(cluster.cluster_group_name.lower(), []).append(cluster)
    groups = []
    for members in by_group.values():
        first = members[0]
        gpus: dict[str, tuple[str, dict[str, GroupInstanceType]]] = {}
        for cluster in members:
            for gpu in cluster.gpus:
                name, types = gpus.setdefault(gpu.name.upper(), (gpu.name, {}))
                for it in gpu.instance_types:
                    seen = types.get(it.name.upper())
                    types[it.name.upper()] = GroupInstanceType(
                        name=seen.name if seen else it.name,
                        value=it.value,
                        description=seen.description if seen else describe(name, it),
                        default=it.default or (seen is not None and seen.default),
                    )
        groups.append(
            ClusterGroup(
                id=first.cluster_group_id,
                name=first.cluster_group_name,
                nca_id=first.nca_id,
                authorized_nca_ids=tuple(sorted({a for c in members for a in c.authorized_nca_ids})),
                gpus=tuple(GroupGpu(name=name, instance_types=tuple(types.values())) for name, types in gpus.values()),
                clusters=tuple(
                    GroupCluster(id=c.cluster_id, name=c.cluster_name, k8s_version=c.k8s_version) for c in members
                ),
            )
        )
    return tuple(sorted(groups, key=lambda g: g.name.lower()))


def _lowered(values: Iterable[str]) -> set[str]:
    return {v.lower() for v in values}


def _instance_type(spec: InstanceTypeSpec, gpu: GpuSpecInput, where: str) -> InstanceType:
    parsed = parse_instance_type(spec.name)
    value = spec.value or (parsed.value if parsed else None)
    if value is None:
        raise ProblemError(
            400, f"{where}.value is required when the name is not of the form <CSP>.GPU.<GPU>_<n>x: {spec.name!r}"
        )
    nodes = parsed.nodes if parsed else 1
    per_node = spec.gpu_count or (parsed.gpus_per_node if parsed else 1)
    total = per_node * nodes
    return InstanceType(
        name=spec.name,
        value=value,
        gpu_count=total,
        max_instances=gpu.capacity // total,
        description=spec.description or "",
        default=spec.default,
        nodes=nodes,
        cpu_cores=spec.cpu_cores,
        system_memory=spec.system_memory,
        gpu_memory=spec.gpu_memory,
        cpu_arch=spec.cpu_arch,
        os=spec.os,
        driver_version=spec.driver_version,
        storage=spec.storage,
    )


def _gpus(specs: tuple[GpuSpecInput, ...]) -> tuple[ClusterGpu, ...]:
    out = []
    seen: set[str] = set()
    for i, gpu in enumerate(specs):
        if gpu.name.upper() in seen:
            raise ProblemError(400, f"gpus[{i}]: GPU {gpu.name!r} is listed twice")
        seen.add(gpu.name.upper())
        types = tuple(
            _instance_type(it, gpu, f"gpus[{i}].instanceTypes[{j}]") for j, it in enumerate(gpu.instance_types)
        )
        if types and not any(t.default for t in types):
            types = (evolve(types[0], default=True), *types[1:])
        out.append(ClusterGpu(name=gpu.name, capacity=gpu.capacity, instance_types=types))
    return tuple(out)


def acting_account(call: Call[Any]) -> str:
    """The path's account: the caller's own, or any for a super admin (404 otherwise, as for others' objects)."""
    nca_id = call.account
    if nca_id != call.principal.account and not call.principal.super_admin:
        raise ProblemError(404, f"account {nca_id!r} not found")
    return nca_id


def heartbeat(ctl: Control, cluster_id: str) -> ClusterHeartbeat | None:
    return ctl.store.health.get(cluster_id)


def ready(ctl: Control, clusters: Iterable[Cluster]) -> list[Cluster]:
    ttl = ctl.config.cluster_heartbeat_ttl
    return [c for c in clusters if placeable(c, heartbeat(ctl, c.cluster_id), ttl)]


# ---- cluster groups ----------------------------------------------------------------------------


@routes.route(
    "GET",
    "/v2/nvcf/clusterGroups",
    summary="Cluster groups (backends) the account may deploy on, with their GPUs and instance types.",
    tag=TAG_GROUPS,
    scopes=(S.LIST_CLUSTER_GROUPS,),
    response=ClusterGroupsResponse,
    cross_account=True,
)
async def list_cluster_groups(ctl: Control, call: Call[None]) -> ClusterGroupsResponse:
    return ClusterGroupsResponse(
        cluster_groups=cluster_groups(visible_clusters(ctl.store.clusters.values(), call.account))
    )


@routes.route(
    "GET",
    "/v1/si/accounts/{ncaId}/clusterGroups",
    account_from_path=True,
    summary="Cluster groups an account may deploy on (ICMS).",
    tag=TAG_ICMS,
    scopes=(S.CLUSTER_LISTING, S.LIST_CLUSTER_GROUPS),
    response=ClusterGroupsResponse,
    params=(Param(name="instanceTypeUsage", description="DEFAULT or CONTAINER (both list every type)."),),
    errors=(404,),
)
async def list_account_cluster_groups(ctl: Control, call: Call[None]) -> ClusterGroupsResponse:
    nca_id = acting_account(call)
    usage = call.query("instanceTypeUsage")
    if usage is not None and usage.upper() not in ("DEFAULT", "CONTAINER"):
        raise ProblemError(400, f"instanceTypeUsage must be DEFAULT or CONTAINER, got {usage!r}")
    return ClusterGroupsResponse(cluster_groups=cluster_groups(visible_clusters(ctl.store.clusters.values(), nca_id)))


# ---- ICMS listings -----------------------------------------------------------------------------

FILTERS = (
    Param(name="gpus", description="Only these GPUs (comma-separated)."),
    Param(name="backends", description="Only clusters of these cluster groups."),
    Param(name="regions", description="Only clusters in these regions."),
    Param(name="clusters", description="Only these clusters (names or ids)."),
    Param(name="attributes", description="Only clusters with all of these attributes."),
    Param(name="instanceType", description="Only these instance types."),
)


def offered(ctl: Control, call: Call[None]) -> list[tuple[Cluster, ClusterGpu, InstanceType]]:
    """Every (ready cluster, GPU, instance type) visible to the account that passes the filters."""
    nca_id = acting_account(call)
    gpus, backends = _lowered(call.query_list("gpus")), _lowered(call.query_list("backends"))
    regions, names = _lowered(call.query_list("regions")), _lowered(call.query_list("clusters"))
    attributes = tuple(call.query_list("attributes"))
    types = _lowered(call.query_list("instanceType"))
    out = []
    for cluster in ready(ctl, visible_clusters(ctl.store.clusters.values(), nca_id)):
        if backends and cluster.cluster_group_name.lower() not in backends:
            continue
        if regions and cluster.region.lower() not in regions:
            continue
        if names and not ({cluster.cluster_name.lower(), cluster.cluster_id.lower()} & names):
            continue
        if attributes and not cluster.has_attributes(attributes):
            continue
        for gpu in cluster.gpus:
            if gpus and gpu.name.lower() not in gpus:
                continue
            for it in gpu.instance_types:
                if not types or it.name.lower() in types:
                    out.append((cluster, gpu, it))
    return out


@routes.route(
    "GET",
    "/v1/si/accounts/{ncaId}/instanceTypes",
    account_from_path=True,
    summary="Instance types by GPU on the account's ready clusters: {<gpu>: [instance type, ...]}.",
    tag=TAG_ICMS,
    scopes=(S.INSTANCE_TYPES,),
    response=dict[str, tuple[InstanceTypeDetails, ...]],
    params=FILTERS,
    errors=(404,),
)
async def list_instance_types(ctl: Control, call: Call[None]) -> dict[str, tuple[InstanceTypeDetails, ...]]:
    merged: dict[str, dict[str, InstanceTypeDetails]] = {}
    gpu_names: dict[str, str] = {}
    for cluster, gpu, it in offered(ctl, call):
        gpu_name = gpu_names.setdefault(gpu.name.upper(), gpu.name)
        types = merged.setdefault(gpu_name, {})
        seen = types.get(it.name.upper())
        if seen is None:
            seen = InstanceTypeDetails(
                name=it.name,
                value=it.value,
                description=describe(gpu_name, it),
                gpu_count=it.gpu_count,
                clusters=(),
                regions=(),
                attributes=(),
                cpu_cores=it.cpu_cores,
                system_memory=it.system_memory,
                gpu_memory=it.gpu_memory,
                cpu_arch=it.cpu_arch,
                os=it.os,
                driver_version=it.driver_version,
                storage=it.storage,
            )
        types[it.name.upper()] = evolve(
            seen,
            clusters=tuple(sorted({*seen.clusters, cluster.cluster_name})),
            regions=tuple(sorted({*seen.regions, cluster.region})),
            attributes=tuple(sorted({*seen.attributes, *cluster.attributes})),
        )
    return {
        gpu: tuple(sorted(types.values(), key=lambda t: (t.gpu_count, t.name.lower())))
        for gpu, types in sorted(merged.items())
    }


@routes.route(
    "GET",
    "/v1/si/accounts/{ncaId}/gpus",
    account_from_path=True,
    summary="GPU names on the account's ready clusters.",
    tag=TAG_ICMS,
    scopes=(S.GPU_LISTING, S.INSTANCE_TYPES),
    response=GpuListing,
    params=FILTERS,
    errors=(404,),
)
async def list_gpus(ctl: Control, call: Call[None]) -> GpuListing:
    names: dict[str, str] = {}
    for _, gpu, _ in offered(ctl, call):
        names.setdefault(gpu.name.upper(), gpu.name)
    return GpuListing(gpus=tuple(sorted(names.values())))


@routes.route(
    "GET",
    "/v1/si/accounts/{ncaId}/regions",
    account_from_path=True,
    summary="Regions of the account's ready clusters.",
    tag=TAG_ICMS,
    scopes=(S.REGIONS_LISTING, S.INSTANCE_TYPES),
    response=RegionListing,
    params=FILTERS,
    errors=(404,),
)
async def list_regions(ctl: Control, call: Call[None]) -> RegionListing:
    return RegionListing(regions=tuple(sorted({c.region.lower() for c, _, _ in offered(ctl, call)})))


@routes.route(
    "GET",
    "/v1/si/accounts/{ncaId}/clusterNames",
    account_from_path=True,
    summary="Names of the account's ready clusters.",
    tag=TAG_ICMS,
    scopes=(S.CLUSTERS_LISTING, S.INSTANCE_TYPES),
    response=ClusterNameListing,
    params=FILTERS,
    errors=(404,),
)
async def list_cluster_names(ctl: Control, call: Call[None]) -> ClusterNameListing:
    return ClusterNameListing(cluster_names=tuple(sorted({c.cluster_name for c, _, _ in offered(ctl, call)})))


@routes.route(
    "GET",
    "/v1/si/accounts/{ncaId}/attributes",
    account_from_path=True,
    summary="Attributes of the account's ready clusters.",
    tag=TAG_ICMS,
    scopes=(S.ATTRIBUTES_LISTING, S.INSTANCE_TYPES),
    response=AttributeListing,
    params=FILTERS,
    errors=(404,),
)
async def list_attributes(ctl: Control, call: Call[None]) -> AttributeListing:
    return AttributeListing(attributes=tuple(sorted({a for c, _, _ in offered(ctl, call) for a in c.attributes})))


# ---- ICMS cluster management -------------------------------------------------------------------


def view(ctl: Control, cluster: Cluster) -> ClusterView:
    beat = heartbeat(ctl, cluster.cluster_id)
    status, maintenance = health_of(beat, ctl.config.cluster_heartbeat_ttl)
    return ClusterView(
        cluster_id=cluster.cluster_id,
        cluster_name=cluster.cluster_name,
        cluster_group_name=cluster.cluster_group_name,
        cluster_group_id=cluster.cluster_group_id,
        nca_id=cluster.nca_id,
        authorized_nca_ids=cluster.authorized_nca_ids,
        cloud_provider=cluster.cloud_provider,
        region=cluster.region,
        capabilities=cluster.capabilities,
        attributes=cluster.attributes,
        gpus=cluster.gpus,
        nvca_version=(beat.nvca_version if beat and beat.nvca_version else cluster.nvca_version),
        cluster_source=cluster.source,
        status=status,
        maintenance_mode=maintenance,
        registered_at=cluster.registered_at,
        # The heartbeat record expires after the TTL; then the last registration is the last contact.
        nvca_last_connected=beat.at if beat is not None else cluster.last_registered_at,
        k8s_version=cluster.k8s_version,
        gpu_usage=dict(beat.gpu_usage) if beat is not None and status == "healthy" else None,
    )


async def owned(ctl: Control, call: Call[Any]) -> Cluster:
    nca_id = acting_account(call)
    cluster_id = call.path("clusterId")
    cluster = ctl.store.clusters.get(cluster_id)
    if cluster is None and _CLUSTER_ID_RX.fullmatch(cluster_id):
        cluster = await ctl.store.clusters.fetch(cluster_id)
    if cluster is None or cluster.nca_id != nca_id:
        raise ProblemError(404, f"Cluster '{cluster_id}' not found")
    return cluster


@routes.route(
    "POST",
    "/v1/accounts/{ncaId}/clusters",
    account_from_path=True,
    summary="Register a cluster; its agent then connects with the returned clusterId.",
    tag=TAG_ICMS,
    scopes=(S.CLUSTER_MANAGEMENT,),
    body=RegisterClusterRequest,
    response=RegisteredCluster,
    errors=(404, 409),
)
async def register_cluster(ctl: Control, call: Call[RegisterClusterRequest]) -> RegisteredCluster:
    nca_id = acting_account(call)
    req = call.body
    if req.nca_id != nca_id:
        raise ProblemError(400, f"'ncaId' ({req.nca_id}) must be the account in the path ({nca_id})")
    if not req.nvca_version.strip():
        raise ProblemError(400, "'nvcaVersion' must not be blank")
    for other in ctl.store.clusters.values():
        if other.nca_id == nca_id and other.cluster_name.lower() == req.cluster_name.lower():
            raise ProblemError(
                409, f"account {nca_id!r} already has a cluster named {other.cluster_name!r} ({other.cluster_id})"
            )
    now = now_iso()
    cluster = Cluster(
        cluster_id=new_id(),
        cluster_name=req.cluster_name,
        cluster_group_name=req.cluster_group_name,
        cluster_group_id=group_id(req.cluster_group_name),
        nca_id=nca_id,
        region=req.region,
        cloud_provider=req.cloud_provider.value,
        gpus=_gpus(req.gpus),
        registered_at=now,
        authorized_nca_ids=tuple(dict.fromkeys(req.authorized_nca_ids)),
        attributes=tuple(dict.fromkeys(req.attributes)),
        capabilities=_canonical_capabilities(req.capabilities),
        nvca_version=req.nvca_version.strip(),
        source="api",
    )
    try:
        await ctl.store.clusters.create(cluster.cluster_id, cluster)
    except ConflictError as err:  # a fresh uuid: only a retried request could collide
        raise ProblemError(409, f"cluster {cluster.cluster_id} already exists") from err
    ctl.poke()
    return RegisteredCluster(cluster_id=cluster.cluster_id, cluster_group_id=cluster.cluster_group_id)


async def list_clusters(ctl: Control, call: Call[None]) -> ClusterListResponse:
    nca_id = acting_account(call)
    mine = sorted(
        (c for c in ctl.store.clusters.values() if c.nca_id == nca_id),
        key=lambda c: (c.cluster_name.lower(), c.cluster_id),
    )
    return ClusterListResponse(clusters=tuple(view(ctl, c) for c in mine))


async def get_cluster(ctl: Control, call: Call[None]) -> ClusterView:
    return view(ctl, await owned(ctl, call))


# The reads are also at NVCF's service-info paths (ICMS serves both).
for prefix, suffix in (("/v1", ""), ("/v1/si", "_service_info")):
    routes.route(
        "GET",
        f"{prefix}/accounts/{{ncaId}}/clusters",
        account_from_path=True,
        summary="The account's registered clusters, with health from their agents' heartbeats.",
        tag=TAG_ICMS,
        scopes=MANAGE_READ_SCOPES,
        response=ClusterListResponse,
        errors=(404,),
    )(alias(list_clusters, f"list_clusters{suffix}") if suffix else list_clusters)
    routes.route(
        "GET",
        f"{prefix}/accounts/{{ncaId}}/clusters/{{clusterId}}",
        account_from_path=True,
        summary="One registered cluster, with its health.",
        tag=TAG_ICMS,
        scopes=MANAGE_READ_SCOPES,
        response=ClusterView,
        errors=(404,),
    )(alias(get_cluster, f"get_cluster{suffix}") if suffix else get_cluster)


@routes.route(
    "PUT",
    "/v1/accounts/{ncaId}/clusters/{clusterId}",
    account_from_path=True,
    summary="Change a cluster's group, authorized accounts, attributes, capabilities or region.",
    description="The settings then outlast the agent's registrations (which still update the inventory).",
    tag=TAG_ICMS,
    scopes=(S.CLUSTER_MANAGEMENT,),
    body=UpdateClusterRequest,
    response=ClusterView,
    errors=(404,),
)
async def update_cluster(ctl: Control, call: Call[UpdateClusterRequest]) -> ClusterView:
    req = call.body
    if all(
        v is None
        for v in (req.cluster_group_name, req.authorized_nca_ids, req.attributes, req.capabilities, req.region)
    ):
        raise ProblemError(
            400,
            "At least one of 'clusterGroupName', 'authorizedNCAIds', 'attributes', 'capabilities' or 'region' "
            "must be specified",
        )
    found = await owned(ctl, call)

    def change(current: Cluster | None) -> Cluster | None:
        if current is None or current.nca_id != found.nca_id:
            raise ProblemError(404, f"Cluster '{found.cluster_id}' not found")
        group = req.cluster_group_name or current.cluster_group_name
        updated = evolve(
            current,
            cluster_group_name=group,
            cluster_group_id=group_id(group),
            authorized_nca_ids=tuple(dict.fromkeys(req.authorized_nca_ids))
            if req.authorized_nca_ids is not None
            else current.authorized_nca_ids,
            attributes=tuple(dict.fromkeys(req.attributes)) if req.attributes is not None else current.attributes,
            capabilities=_canonical_capabilities(req.capabilities)
            if req.capabilities is not None
            else current.capabilities,
            region=req.region or current.region,
            # Operator-managed from now on: the agent's next registration keeps these settings.
            source="api",
        )
        if updated == current:
            raise Unchanged
        return updated

    updated = await ctl.store.clusters.mutate(found.cluster_id, change)
    assert updated is not None
    ctl.poke()
    return view(ctl, updated)


@routes.route(
    "DELETE",
    "/v1/accounts/{ncaId}/clusters/{clusterId}",
    account_from_path=True,
    summary="Deregister a cluster (refused while deployments have instances on it).",
    tag=TAG_ICMS,
    scopes=(S.CLUSTER_MANAGEMENT,),
    errors=(404,),
)
async def delete_cluster(ctl: Control, call: Call[None]) -> None:
    cluster = await owned(ctl, call)
    live = [
        inst
        for ledger in ctl.store.placements.values()
        for inst in ledger.instances
        if inst.cluster_id == cluster.cluster_id and inst.phase in LIVE
    ]
    if live:
        raise ProblemError(
            400,
            f"Cluster '{cluster.cluster_name}' still has {len(live)} instance(s) of deployments on it; "
            "undeploy them (or change their specs) before deleting the cluster",
        )
    await ctl.store.clusters.mutate(cluster.cluster_id, lambda _: None)
    await ctl.store.health.mutate(cluster.cluster_id, lambda _: None)
    ctl.poke()
