"""The example function: at first start, the echo example is registered and deployed once a cluster is there.

It happens once per platform: ``example-function.json`` in the control plugin's state directory
remembers it (``pending`` until deployed, then ``deployed``; ``removed`` once the function is found
deleted), so deleting the function later does not bring it back. The CLI's ready banner reads the
same file to print how to invoke it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs

from nvcf_mono.bus.errors import ConflictError
from nvcf_mono.contracts import buckets
from nvcf_mono.contracts.example import NAME, SAMPLE_BODY, Marker, marker_path, read_marker
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.cluster import Cluster, InstanceType
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.deployment import GpuSpec
from nvcf_mono.models.function import (
    ApiBodyFormat,
    FunctionStatus,
    FunctionType,
    FunctionVersion,
    Health,
    HealthProtocol,
)
from nvcf_mono.planes.control.catalog import check_spec, placeable, visible_clusters
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.service import new_deployment, set_status
from nvcf_mono.state_dir import write_private
from nvcf_mono.structure import evolve, structure

PORT = 8000


def write_marker(plugin_state_dir: Path, marker: Marker) -> None:
    doc = {"function_id": marker.function_id, "version_id": marker.version_id, "state": marker.state}
    write_private(marker_path(plugin_state_dir), (json.dumps(doc, indent=2) + "\n").encode())


def example_version(marker: Marker, nca_id: str) -> FunctionVersion:
    """The example as a function version: ``nvcf_mono.examples.echo`` through the built-in ``echo`` image."""
    return FunctionVersion(
        id=marker.function_id,
        nca_id=nca_id,
        version_id=marker.version_id,
        name=NAME,
        status=FunctionStatus.INACTIVE,
        created_at=now_iso(),
        inference_url="/echo",
        inference_port=PORT,
        container_image="echo",
        health=Health(
            protocol=HealthProtocol.HTTP, uri="/health", port=PORT, timeout="PT10S", expected_status_code=200
        ),
        api_body_format=ApiBodyFormat.CUSTOM,
        function_type=FunctionType.DEFAULT,
        description="Example: HTTP echo (nvcf_mono.examples.echo), POST {message, repeats, delay, stream}",
        tags=("example",),
    )


def choose(clusters: list[Cluster]) -> tuple[Cluster, str, InstanceType] | None:
    """The cluster, GPU and smallest instance type to deploy on: ``local`` if registered, else the first."""
    ordered = sorted(clusters, key=lambda c: (c.cluster_name != "local", c.registered_at, c.cluster_id))
    for cluster in ordered:
        for gpu in cluster.gpus:
            if gpu.instance_types:
                smallest = min(gpu.instance_types, key=lambda it: (it.nodes, it.gpu_count, it.name))
                return cluster, gpu.name, smallest
    return None


@attrs.define
class ExampleFunction:
    """Registers and deploys the example once; ``prepare()`` before the plugin is ready, ``run()`` after."""

    ctl: Control
    state_dir: Path
    log: logging.Logger
    marker: Marker | None = None

    def prepare(self) -> Marker:
        """Read (or start) the marker; a deployed example that was deleted is remembered as removed."""
        marker = read_marker(self.state_dir)
        if marker is None:
            marker = Marker(function_id=new_id(), version_id=new_id(), state="pending")
            write_marker(self.state_dir, marker)
        elif marker.state == "deployed" and self.ctl.store.functions.get(marker.key) is None:
            marker = attrs.evolve(marker, state="removed")
            write_marker(self.state_dir, marker)
        self.marker = marker
        return marker

    async def run(self) -> None:
        """Once a cluster has registered: create and deploy a pending example, then log how to invoke it."""
        marker = self.marker or self.prepare()
        if marker.state != "pending":
            return
        account = self.ctl.config.default_account
        version = -1
        while True:
            version = self.ctl.wake.version
            target = self._target(account)
            if target is not None:
                break
            await self.ctl.wake.wait(after=version)
        fv = await self._register(marker, account)
        try:
            await self._deploy(fv, *target)
        except ProblemError as err:
            # The next start tries again (the marker stays pending).
            self.log.warning("could not deploy the example function %s: %s", fv.id, err.detail)
            return
        self.marker = attrs.evolve(marker, state="deployed")
        write_marker(self.state_dir, self.marker)
        self.log.info("deploying the example function %s (%s); invoke it once it is ACTIVE", NAME, fv.id)
        await self._report_active(fv)

    def _target(self, account: str) -> tuple[list[Cluster], Cluster, str, InstanceType] | None:
        store = self.ctl.store
        mine = visible_clusters(store.clusters.values(), account)
        ttl = self.ctl.config.cluster_heartbeat_ttl
        ready = [c for c in mine if placeable(c, store.health.get(c.cluster_id), ttl)]
        chosen = choose(ready)
        return None if chosen is None else (mine, *chosen)

    async def _register(self, marker: Marker, account: str) -> FunctionVersion:
        store = self.ctl.store
        existing = await store.functions.fetch(marker.key)
        if existing is not None:
            return existing
        fv = example_version(marker, account)
        try:
            await store.functions.create(marker.key, fv)
        except ConflictError:
            found = await store.functions.fetch(marker.key)
            assert found is not None
            return found
        return fv

    async def _deploy(
        self, fv: FunctionVersion, mine: list[Cluster], cluster: Cluster, gpu: str, it: InstanceType
    ) -> None:
        store = self.ctl.store
        key = buckets.version_key(fv.id, fv.version_id)
        if await store.deployments.fetch(key) is not None:
            return
        requested: GpuSpec = structure(
            GpuSpec,
            {
                "gpu": gpu,
                "instanceType": it.name,
                # Scale to zero: the first call wakes an instance, an idle one goes away again.
                "minInstances": 0,
                "maxInstances": 2,
                "backend": cluster.cluster_group_name,
                "maxRequestConcurrency": 4,
            },
        )
        spec = evolve(check_spec(mine, fv.nca_id, requested, fv), gpu_specification_id=new_id())
        deployment = new_deployment(fv, (spec,))
        try:
            await store.deployments.create(key, deployment)
        except ConflictError:
            return
        await set_status(self.ctl, fv, FunctionStatus.ACTIVE)  # every minInstances is 0
        self.ctl.poke()

    async def _report_active(self, fv: FunctionVersion) -> None:
        """Log once the example is ACTIVE (or say why not); gives up quietly if it is deleted meanwhile."""
        key = buckets.version_key(fv.id, fv.version_id)
        while True:
            version = self.ctl.wake.version
            current = self.ctl.store.functions.get(key)
            if current is None or current.status is FunctionStatus.INACTIVE:
                return
            if current.status is FunctionStatus.ACTIVE:
                self.log.info(
                    "the example function %s (%s) is ACTIVE at zero instances; the first call starts one: "
                    "nvcf-mono invoke %s -d '%s' (curl: see the ready banner)",
                    NAME,
                    fv.id,
                    fv.id,
                    SAMPLE_BODY,
                )
                return
            if current.status is FunctionStatus.ERROR:
                self.log.warning("the example function %s (%s) failed to deploy: see its instances", NAME, fv.id)
                return
            await self.ctl.wake.wait(after=version)
