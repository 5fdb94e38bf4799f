from __future__ import annotations

from pathlib import Path

from nvcf_mono.testing.platform import wait_for

from .conftest import CONTAINER_FUNCTION, agent, platform


async def test_deploy_reaches_active_with_a_scripted_agent(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus) as fake:
        created = await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
        assert created.status == 200, created.body
        fn = created.json["function"]
        d = f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}"
        dep = await p.admin.post(
            d,
            {
                "deploymentSpecifications": [
                    {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 2, "maxInstances": 2}
                ]
            },
        )
        assert dep.status == 200, dep.body
        assert dep.json["deployment"]["functionStatus"] == "DEPLOYING"

        async def active():
            r = await p.admin.get(d)
            return r.json["deployment"]["functionStatus"] == "ACTIVE" and r.json

        doc = await wait_for(active, what="ACTIVE")
        assert len(fake.creations) == 2
        spec = doc["deployment"]["deploymentSpecifications"][0]
        assert spec["placement"]["runningInstances"] == 2
        undeployed = await p.admin.delete(d)
        assert undeployed.status == 200
        assert undeployed.json["function"]["status"] == "INACTIVE"

        async def terminated():
            return len(fake.terminations) == 2 and not fake.live()

        await wait_for(terminated, what="terminations")
