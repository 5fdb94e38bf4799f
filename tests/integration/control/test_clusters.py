"""Cluster groups, the ICMS listings, and ICMS cluster registration and management."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvcf_mono.planes.control.icms import group_id
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import other_account_key
from nvcf_mono.testing.scripted_agent import gpu_inventory

from .conftest import CONTAINER_FUNCTION, Platform, agent, platform

CLUSTERS = "/v1/accounts/nvcf-default/clusters"
SI = "/v1/si/accounts/nvcf-default"
H100_TYPES = ["ON-PREM.GPU.H100_1x", "ON-PREM.GPU.H100_2x", "ON-PREM.GPU.H100_4x", "ON-PREM.GPU.H100_8x"]
REGISTRATION = {
    "clusterName": "byoc",
    "clusterGroupName": "byoc-group",
    "ncaId": "nvcf-default",
    "cloudProvider": "on-prem",
    "nvcaVersion": "2.1.0",
    "region": "us-east-1",
    "authorizedNCAIds": ["acct-two"],
    "capabilities": ["dynamicgpudiscovery"],
    "attributes": ["CacheOptimized"],
}


async def account_client(p: Platform, nca_id: str, *scope_names: str) -> Api:
    """A client with a key of another account holding ``scope_names``."""
    return p.api(await other_account_key(p, nca_id, scope_names, shared=False))


async def test_an_agents_cluster_shows_in_groups_listings_and_the_cluster_list(tmp_path: Path) -> None:
    async with (
        platform(tmp_path) as p,
        agent(p.bus, attributes=("NVLinkOptimized",), capabilities=("HelmMiniService",)) as fake,
    ):
        groups = await p.admin.get("/v2/nvcf/clusterGroups")
        assert groups.status == 200, groups.body
        [group] = groups.json["clusterGroups"]
        assert group["name"] == "local" and group["id"] == group_id("local")
        assert group["ncaId"] == "nvcf-default" and group["authorizedNcaIds"] == ["*"]
        assert group["clusters"] == [{"id": fake.cluster_id, "name": "local"}]
        [gpu] = group["gpus"]
        assert gpu["name"] == "H100"
        assert [t["name"] for t in gpu["instanceTypes"]] == H100_TYPES
        first = gpu["instanceTypes"][0]
        assert first == {"name": H100_TYPES[0], "value": "ON-PREM.GPU.H100", "description": "1x H100", "default": True}
        assert [t["default"] for t in gpu["instanceTypes"]] == [True, False, False, False]

        icms_groups = await p.admin.get(f"{SI}/clusterGroups", params={"instanceTypeUsage": "container"})
        assert icms_groups.status == 200 and icms_groups.json == groups.json
        assert (await p.admin.get(f"{SI}/clusterGroups", params={"instanceTypeUsage": "GPU"})).status == 400

        types = await p.admin.get(f"{SI}/instanceTypes")
        assert types.status == 200, types.body
        assert list(types.json) == ["H100"]
        assert [t["name"] for t in types.json["H100"]] == H100_TYPES
        eight = types.json["H100"][3]
        assert eight["gpuCount"] == 8 and eight["description"] == "8x H100"
        assert eight["clusters"] == ["local"] and eight["regions"] == ["us-west-1"]
        assert eight["attributes"] == ["NVLinkOptimized"] and eight["value"] == "ON-PREM.GPU.H100"

        async def listing(path: str, **query: str) -> Any:
            reply = await p.admin.get(f"{SI}/{path}", params=query)
            assert reply.status == 200, reply.body
            return reply.json

        two = await listing("instanceTypes", instanceType="on-prem.gpu.h100_2x")
        assert [t["name"] for t in two["H100"]] == ["ON-PREM.GPU.H100_2x"]
        assert await listing("instanceTypes", gpus="A100") == {}
        assert await listing("instanceTypes", regions="eu-west-1") == {}
        assert await listing("instanceTypes", backends="other") == {}
        assert await listing("instanceTypes", attributes="CacheOptimized") == {}
        assert list(await listing("instanceTypes", attributes="nvlinkoptimized", clusters="local")) == ["H100"]
        assert await listing("gpus") == {"gpus": ["H100"]}
        assert await listing("regions") == {"regions": ["us-west-1"]}
        assert await listing("clusterNames") == {"clusterNames": ["local"]}
        assert await listing("attributes") == {"attributes": ["NVLinkOptimized"]}
        assert await listing("gpus", gpus="B200") == {"gpus": []}

        listed = await p.admin.get(CLUSTERS)
        assert listed.status == 200, listed.body
        [cluster] = listed.json["clusters"]
        assert cluster["clusterId"] == fake.cluster_id and cluster["clusterName"] == "local"
        assert cluster["status"] == "healthy" and cluster["clusterSource"] == "agent"
        assert cluster["nvcaLastConnected"] and cluster["registeredAt"]
        assert cluster["gpuUsage"] == {"H100": {"capacity": 8, "available": 8, "allocated": 0}}
        assert cluster["capabilities"] == ["HelmMiniService"] and cluster["authorizedNCAIds"] == ["*"]
        assert cluster["gpus"][0]["capacity"] == 8
        one = await p.admin.get(f"{CLUSTERS}/{fake.cluster_id}")
        assert one.status == 200 and one.json["clusterId"] == fake.cluster_id

        # An operator's change outlasts the agent's next registration; the inventory still comes from the agent.
        changed = await p.admin.put(f"{CLUSTERS}/{fake.cluster_id}", {"attributes": ["CacheOptimized"]})
        assert changed.status == 200 and changed.json["attributes"] == ["CacheOptimized"]
        fake.gpus = (gpu_inventory("H100", 4),)
        await fake.register()
        again = (await p.admin.get(f"{CLUSTERS}/{fake.cluster_id}")).json
        assert again["attributes"] == ["CacheOptimized"] and again["gpus"][0]["capacity"] == 4

        # Scopes: the function key may not list clusters or instance types.
        assert (await p.key.get(f"{SI}/instanceTypes")).status == 403
        assert (await p.key.get(CLUSTERS)).status == 403
        assert (await p.key.get("/v2/nvcf/clusterGroups")).status == 403
        assert (await p.anonymous.get(f"{SI}/gpus")).status == 401


@pytest.mark.slow
async def test_a_stopped_agents_cluster_turns_unhealthy_after_the_heartbeat_ttl(tmp_path: Path) -> None:
    async with platform(tmp_path, **{"plugins.control.cluster_heartbeat_ttl": "1"}) as p:
        async with agent(p.bus) as fake:
            url = f"{CLUSTERS}/{fake.cluster_id}"

            async def healthy() -> bool:
                return (await p.admin.get(url)).json["status"] == "healthy"

            async def unhealthy() -> bool:
                return (await p.admin.get(url)).json["status"] == "unhealthy"

            await wait_for(healthy, what="healthy")
            assert (await p.admin.get(f"{SI}/gpus")).json == {"gpus": ["H100"]}
        await wait_for(unhealthy, timeout=10, what="unhealthy after the agent stopped")
        cluster = (await p.admin.get(f"{CLUSTERS}/{fake.cluster_id}")).json
        assert cluster["nvcaLastConnected"] and "gpuUsage" not in cluster
        # Listings only offer ready clusters; the cluster group is still registered.
        assert (await p.admin.get(f"{SI}/gpus")).json == {"gpus": []}
        assert (await p.admin.get(f"{SI}/instanceTypes")).json == {}
        assert [g["name"] for g in (await p.admin.get("/v2/nvcf/clusterGroups")).json["clusterGroups"]] == ["local"]


async def test_rest_registration_then_the_agent_connects(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        registered = await p.admin.post(CLUSTERS, REGISTRATION)
        assert registered.status == 200, registered.body
        cluster_id = registered.json["clusterId"]
        assert registered.json == {"clusterId": cluster_id, "clusterGroupId": group_id("byoc-group")}

        before = (await p.admin.get(f"{CLUSTERS}/{cluster_id}")).json
        assert before["status"] == "unhealthy" and before["clusterSource"] == "api"
        assert before["cloudProvider"] == "ON-PREM" and before["nvcaVersion"] == "2.1.0"
        assert before["authorizedNCAIds"] == ["acct-two"] and before["capabilities"] == ["DynamicGPUDiscovery"]
        assert before["gpus"] == [] and "nvcaLastConnected" not in before

        async with agent(p.bus, cluster_id=cluster_id, cluster_name="agent-name", gpus=[gpu_inventory("L40S", 4)]):
            after = (await p.admin.get(f"{CLUSTERS}/{cluster_id}")).json
            # The agent's inventory; the operator's names, group, accounts and attributes.
            assert after["status"] == "healthy"
            assert [g["name"] for g in after["gpus"]] == ["L40S"]
            assert after["clusterName"] == "byoc" and after["clusterGroupName"] == "byoc-group"
            assert after["authorizedNCAIds"] == ["acct-two"] and after["attributes"] == ["CacheOptimized"]
            types = (await p.admin.get(f"{SI}/instanceTypes")).json
            assert [t["name"] for t in types["L40S"]] == [
                "ON-PREM.GPU.L40S_1x",
                "ON-PREM.GPU.L40S_2x",
                "ON-PREM.GPU.L40S_4x",
            ]
            assert types["L40S"][0]["clusters"] == ["byoc"] and types["L40S"][0]["regions"] == ["us-east-1"]

        updated = await p.admin.put(
            f"{CLUSTERS}/{cluster_id}",
            {"clusterGroupName": "renamed", "attributes": ["NVLinkOptimized"], "region": "eu-west-1"},
        )
        assert updated.status == 200, updated.body
        doc = updated.json
        assert doc["clusterGroupName"] == "renamed" and doc["clusterGroupId"] == group_id("renamed")
        assert doc["attributes"] == ["NVLinkOptimized"] and doc["region"] == "eu-west-1"
        assert doc["authorizedNCAIds"] == ["acct-two"]
        assert (await p.admin.put(f"{CLUSTERS}/{cluster_id}", {})).status == 400
        bad_cap = await p.admin.put(f"{CLUSTERS}/{cluster_id}", {"capabilities": ["Teleport"]})
        assert bad_cap.status == 400 and "Teleport" in bad_cap.json["detail"]

        deleted = await p.admin.delete(f"{CLUSTERS}/{cluster_id}")
        assert deleted.status == 204
        assert (await p.admin.get(f"{CLUSTERS}/{cluster_id}")).status == 404
        assert (await p.admin.get(CLUSTERS)).json == {"clusters": []}


async def test_registration_is_validated(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        assert (await p.admin.post(CLUSTERS, REGISTRATION)).status == 200
        again = await p.admin.post(CLUSTERS, {**REGISTRATION, "clusterName": "BYOC"})
        assert again.status == 409 and "byoc" in again.json["detail"]
        for change, field in (
            ({"clusterName": None}, "clusterName"),
            ({"clusterGroupName": "bad name!"}, "clusterGroupName"),
            ({"cloudProvider": "moon"}, "cloudProvider"),
            ({"region": ""}, "region"),
            ({"nvcaVersion": None}, "nvcaVersion"),
            ({"capabilities": ["Teleport"]}, "capabilities"),
            ({"gpus": [{"name": "H100", "capacity": -1}]}, "gpus.0.capacity"),
        ):
            body = {**REGISTRATION, "clusterName": "other", **change}
            body = {k: v for k, v in body.items() if v is not None}
            reply = await p.admin.post(CLUSTERS, body)
            assert reply.status == 400, (change, reply.body)
            assert "Validation failed" in reply.json["detail"] and field in reply.json["detail"], reply.json
        mismatch = await p.admin.post(CLUSTERS, {**REGISTRATION, "clusterName": "other", "ncaId": "someone"})
        assert mismatch.status == 400 and "ncaId" in mismatch.json["detail"]
        untyped = await p.admin.post(
            CLUSTERS,
            {**REGISTRATION, "clusterName": "other", "gpus": [{"name": "X", "instanceTypes": [{"name": "big"}]}]},
        )
        assert untyped.status == 400 and "value" in untyped.json["detail"]

        # With GPUs given up front, instance types derive what their names say.
        withgpus = await p.admin.post(
            CLUSTERS,
            {
                **REGISTRATION,
                "clusterName": "prelisted",
                "authorizedNcaIds": ["ignored: the key is authorizedNCAIds"],
                "authorizedNCAIds": [],
                "gpus": [
                    {
                        "name": "B200",
                        "capacity": 16,
                        "instanceTypes": [{"name": "ON-PREM.GPU.B200_8x"}, {"name": "ON-PREM.GPU.B200_8x.x2"}],
                    }
                ],
            },
        )
        assert withgpus.status == 200, withgpus.body
        view = (await p.admin.get(f"{CLUSTERS}/{withgpus.json['clusterId']}")).json
        assert view["authorizedNCAIds"] == []
        [single, double] = view["gpus"][0]["instanceTypes"]
        assert (single["gpuCount"], single["maxInstances"], single["default"]) == (8, 2, True)
        assert (double["gpuCount"], double["nodes"], double["maxInstances"]) == (16, 2, 1)


async def test_accounts_manage_only_their_own_clusters(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        cluster_id = (await p.admin.post(CLUSTERS, REGISTRATION)).json["clusterId"]
        other = await account_client(p, "acct-two", "cluster-management", "list_cluster_groups", "instance_types")
        for reply in (
            await other.get(CLUSTERS),
            await other.get(f"{CLUSTERS}/{cluster_id}"),
            await other.delete(f"{CLUSTERS}/{cluster_id}"),
            await other.put(f"{CLUSTERS}/{cluster_id}", {"region": "x"}),
            await other.post(CLUSTERS, REGISTRATION),
            await other.get(f"{SI}/gpus"),
        ):
            assert reply.status == 404, reply.body
        assert (await other.get("/v1/accounts/acct-two/clusters")).json == {"clusters": []}
        assert (await other.get(f"/v1/accounts/acct-two/clusters/{cluster_id}")).status == 404
        # The cluster is authorized for acct-two: it may deploy there, so it sees the group.
        groups = (await other.get("/v2/nvcf/clusterGroups")).json["clusterGroups"]
        assert [g["name"] for g in groups] == ["byoc-group"]
        assert groups[0]["ncaId"] == "nvcf-default" and groups[0]["authorizedNcaIds"] == ["acct-two"]

        # A super admin manages any account's clusters.
        own = await p.admin.post("/v1/accounts/acct-two/clusters", {**REGISTRATION, "ncaId": "acct-two"})
        assert own.status == 200, own.body
        listed = (await other.get("/v1/accounts/acct-two/clusters")).json["clusters"]
        assert [c["clusterId"] for c in listed] == [own.json["clusterId"]]
        # NVCF's service-info paths answer the same, and keep accounts apart the same way.
        assert (await other.get("/v1/si/accounts/acct-two/clusters")).json["clusters"] == listed
        one = await other.get(f"/v1/si/accounts/acct-two/clusters/{own.json['clusterId']}")
        assert one.status == 200 and one.json == listed[0]
        assert (await other.get(f"/v1/si/accounts/acct-two/clusters/{cluster_id}")).status == 404
        assert (await other.get("/v1/si/accounts/nvcf-default/clusters")).status == 404
        assert (await p.admin.get("/v1/accounts/nobody/clusters")).status == 404
        twin = await p.admin.get("/v2/nvcf/accounts/acct-two/clusterGroups")
        assert twin.status == 200 and len(twin.json["clusterGroups"]) == 1


async def test_a_cluster_with_instances_cannot_be_deleted(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus) as fake:
        created = await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
        fn = created.json["function"]
        d = f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        spec = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_2x", "minInstances": 1, "maxInstances": 1}
        assert (await p.admin.post(d, {"deploymentSpecifications": [spec]})).status == 200

        async def active() -> bool:
            return (await p.admin.get(d)).json["deployment"]["functionStatus"] == "ACTIVE"

        await wait_for(active, what="ACTIVE")
        refused = await p.admin.delete(f"{CLUSTERS}/{fake.cluster_id}")
        assert refused.status == 400 and "1 instance" in refused.json["detail"]

        async def usage() -> bool:
            doc = (await p.admin.get(f"{CLUSTERS}/{fake.cluster_id}")).json
            return bool(doc.get("gpuUsage", {}).get("H100", {}).get("allocated") == 2)

        await wait_for(usage, what="the heartbeat's GPU usage")
        assert (await p.admin.delete(d)).status == 200

        async def terminated() -> bool:
            return not fake.live()

        await wait_for(terminated, what="terminations")

        async def deletable() -> bool:
            return (await p.admin.delete(f"{CLUSTERS}/{fake.cluster_id}")).status == 204

        await wait_for(deletable, what="the cluster deleted once its instances are gone")
