"""The agent's periodic comparison with the control plane: what the control plane does not know is stopped."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import ConflictError
from nvcf_mono.contracts import buckets
from nvcf_mono.models.placement import SpecPlacement
from nvcf_mono.structure import evolve
from nvcf_mono.testing.platform import wait_for

from .conftest import CLUSTER_A, all_gone, compute_platform, create, deploy, function, instances, pids, running, spec


@pytest.mark.slow
async def test_an_instance_the_control_plane_forgot_is_stopped_and_replaced(tmp_path: Path) -> None:
    settings = {"plugins.compute.status_interval": "60", "plugins.compute.sync_grace": "0.5"}
    async with compute_platform(tmp_path, **settings) as p:
        _, vid, d = await create(p.admin, function())
        dep = await deploy(p.admin, d, spec())
        (first,) = await running(p.bus, CLUSTER_A)

        async def reported() -> object:
            # Its running state accepted first: a report still on its way would find the instance gone and be
            # answered 412 (precondition failure), the other way NVCA drops an instance, not the one tested here.
            (view,) = await instances(p.bus, CLUSTER_A)
            return view if (view.instance.reported or "").endswith("|running") else None

        first = await wait_for(reported, timeout=15, what="the instance's running state reported")
        # The ledger loses the instance (as if the control plane had given it up while the agent ran it).
        ledgers = TypedKV(p.bus.kv(buckets.PLACEMENTS.name), buckets.PLACEMENT)
        key = buckets.spec_key(vid, dep["deploymentSpecifications"][0]["gpuSpecificationId"])
        for _ in range(100):  # the reconciler writes the same entry (statuses): read, change, write until it wins
            current = await ledgers.get(key)
            assert current is not None
            forgotten: SpecPlacement = evolve(
                current.value, instances=tuple(i for i in current.value.instances if i.request_id != first.request_id)
            )
            try:
                await ledgers.update(key, forgotten, revision=current.revision)
                break
            except ConflictError:
                await anyio.sleep(0.02)
        else:
            pytest.fail("could not edit the placement ledger")

        async def stopped_and_replaced() -> object:
            views = await instances(p.bus, CLUSTER_A, finished=True)
            old = next(v for v in views if v.request_id == first.request_id)
            fresh = [v for v in views if v.request_id != first.request_id and v.instance.state == "running"]
            return old if old.instance.state == "terminated" and fresh else None

        old = await wait_for(stopped_and_replaced, timeout=30, what="the forgotten instance stopped, another running")
        assert old.instance.termination_cause == "instance-terminated-sync-action"
        assert old.instance.status == "instance-terminated-by-service"
        await all_gone(pids([first]))
        await p.admin.delete(d)
