"""What an agent answers on ``nvcf.agent.<call>.<clusterId>``: its cluster, its instances, their logs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anyio.abc import TaskStatus

from nvcf_mono.contracts import rpc, subjects
from nvcf_mono.contracts.agent import (
    AgentCluster,
    AgentGpu,
    AgentInstances,
    AgentInstanceView,
    AgentLogs,
    AgentQuery,
    AgentRequest,
)
from nvcf_mono.contracts.rpc import RpcError

if TYPE_CHECKING:
    from nvcf_mono.planes.compute.agent import ClusterAgent


def _views(requests: list[AgentRequest]) -> list[AgentInstanceView]:
    return [
        AgentInstanceView(
            request_id=req.request_id,
            request_status=req.status,
            function_id=req.message.function_details.function_id if req.message.function_details else None,
            function_version_id=req.message.function_details.function_version_id
            if req.message.function_details
            else None,
            task_id=req.message.task_details.task_id if req.message.task_details else None,
            instance=inst,
        )
        for req in requests
        for inst in req.instances
    ]


class Queries:
    """The responder of one agent."""

    def __init__(self, agent: ClusterAgent) -> None:
        self._agent = agent

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        endpoints: dict[str, rpc.Endpoint] = {
            "cluster": (AgentQuery, self.cluster),
            "instances": (AgentQuery, self.instances),
            "logs": (AgentQuery, self.logs),
        }
        handler = rpc.dispatcher(endpoints, lambda subject: subjects.agent_call_of(subject)[0])
        await self._agent.bus.serve(
            subjects.agent_calls(self._agent.cluster_id), handler, concurrency=4, task_status=task_status
        )

    async def cluster(self, subject: str, query: AgentQuery) -> AgentCluster:
        agent = self._agent
        usage = agent.allocator.usage()
        return AgentCluster(
            cluster_id=agent.cluster_id,
            cluster_name=agent.ident.name,
            cluster_group_name=agent.ident.group,
            region=agent.ident.region,
            backend=agent.backend.name,
            gpus=tuple(
                AgentGpu(name=m.name, capacity=m.capacity, allocated=usage[m.name].allocated, discovered=m.source)
                for m in agent.allocator.inventory.models
            ),
            instances=sum(1 for r in agent.book for i in r.instances if not i.gone),
            registered_at=agent.registered_at,
            last_heartbeat_at=agent.last_heartbeat_at,
        )

    async def instances(self, subject: str, query: AgentQuery) -> AgentInstances:
        agent = self._agent
        held = list(agent.book)
        if query.finished:
            held += await agent.book.remembered()
        views = _views(held)
        if query.instance_id is not None:
            views = [v for v in views if v.instance.instance_id == query.instance_id]
        return AgentInstances(cluster_id=agent.cluster_id, instances=tuple(views))

    async def logs(self, subject: str, query: AgentQuery) -> AgentLogs:
        agent = self._agent
        if not query.instance_id:
            raise RpcError(400, "name the instance (instanceId)")
        held = list(agent.book) + await agent.book.remembered()
        for req in held:
            inst = req.instance(query.instance_id)
            if inst is not None and inst.directory:
                tail = max(0, min(query.tail, 4 * 1024 * 1024))
                logs = await agent.backend.logs(agent.cluster_id, inst, tail)
                return AgentLogs(instance_id=inst.instance_id, logs=logs)
        raise RpcError(404, f"instance {query.instance_id!r} is not on cluster {agent.ident.name}")
