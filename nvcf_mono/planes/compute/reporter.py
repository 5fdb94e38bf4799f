"""Instance status reports to the control plane: on every change, and every instance periodically
(NVCA's ``PeriodicInstanceStatusUpdate``). A report is done once the control plane accepts it; a 412
means the control plane does not want the instance: it is stopped (reference compute-plane §4).
"""

from __future__ import annotations

import logging
import time

import anyio

from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts import states
from nvcf_mono.contracts.agent import AgentInstance, AgentRequest, RequestStatus
from nvcf_mono.contracts.rpc import RpcError
from nvcf_mono.models.common import now_iso
from nvcf_mono.planes.compute.config import ComputeConfig
from nvcf_mono.planes.compute.control import ControlClient, status_report, unknown_terminated
from nvcf_mono.planes.compute.requests import RequestBook
from nvcf_mono.planes.compute.supervisor import Supervisor
from nvcf_mono.structure import evolve

#: Answers to a report of a gone instance that mean "nothing more to say".
_IGNORED_FOR_GONE = frozenset({404, 409, 412, 500})


class Reporter:
    """Sends what the control plane has not accepted yet."""

    def __init__(
        self,
        *,
        book: RequestBook,
        control: ControlClient,
        supervisor: Supervisor,
        config: ComputeConfig,
        log: logging.Logger,
    ) -> None:
        self._book = book
        self._control = control
        self._supervisor = supervisor
        self._config = config
        self._log = log
        self._wanted = anyio.Event()
        self._forced: set[str] = set()

    def wake(self) -> None:
        """Something changed: report soon."""
        self._wanted.set()

    def force(self, instance_id: str) -> None:
        """Report this instance again even though its state was accepted (the control plane sees it otherwise)."""
        self._forced.add(instance_id)
        self._wanted.set()

    async def run(self) -> None:
        last_full = time.monotonic()
        pause = 0.2
        interval = self._config.status_interval
        while True:
            with anyio.move_on_after(max(interval - (time.monotonic() - last_full), 0)):
                await self._wanted.wait()
            self._wanted = anyio.Event()
            full = time.monotonic() - last_full >= interval
            if full:
                last_full = time.monotonic()
            if await self.round(full=full):
                pause = 0.2
            else:
                await anyio.sleep(pause)
                pause = min(pause * 2, self._config.retry_backoff_max)
                self._wanted.set()

    async def round(self, *, full: bool) -> bool:
        """Report every instance whose state was not accepted (with ``full``: every live one); False if some failed."""
        ok = True
        for req in list(self._book):
            if req.status is RequestStatus.RECEIVED:
                continue  # the control plane has not confirmed it yet
            for inst in req.instances:
                wanted = (full and not inst.gone) or inst.instance_id in self._forced
                if inst.reported == inst.signature and not wanted:
                    continue
                try:
                    ok = await self._report(req, inst) and ok
                except BusError as err:
                    # The control plane cannot be reached: the rest would wait just as long.
                    self._log.debug("status reports wait: %s", err)
                    return False
        return ok

    async def _report(self, req: AgentRequest, inst: AgentInstance) -> bool:
        signature = inst.signature
        try:
            await self._control.status(status_report(req, inst))
        except RpcError as err:
            if inst.gone and err.code in _IGNORED_FOR_GONE:
                pass
            elif err.code == 412:
                self._log.info("the control plane does not want instance %s: stopping it", inst.instance_id)
                await self._supervisor.stop(req.request_id, inst.instance_id, states.PRECONDITION_FAILURE)
            else:
                self._log.warning("status report of instance %s refused: %s", inst.instance_id, err)
                return False
        self._forced.discard(inst.instance_id)
        stamp = now_iso()
        await self._supervisor.update(
            req.request_id,
            inst.instance_id,
            lambda i: evolve(i, reported=signature, reported_at=stamp) if i.signature == signature else i,
        )
        return True

    async def nothing_runs(self, request_id: str, instance_ids: list[str], function_version_id: str | None) -> None:
        """Tell the control plane that a request it asked about runs nothing here (best effort)."""
        for instance_id in instance_ids:
            try:
                await self._control.status(unknown_terminated(request_id, instance_id, function_version_id))
            except (RpcError, BusError) as err:
                self._log.info("reporting request %s as terminated failed: %s", request_id, err)
