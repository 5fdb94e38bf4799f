"""No ready instance is a reason to wait, not a client error: DEGRADED and DEPLOYING versions queue requests.

A version in ERROR, whose instances will not come back until it is deployed again, says so with a 503.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvcf_mono.contracts import states
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.testing.platform import Api, wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION, agent, platform

pytestmark = pytest.mark.chaos

SPEC = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 1, "maxInstances": 1}


async def _status(api: Api, d: str) -> str:
    return str((await api.get(d)).json["deployment"]["functionStatus"])


async def _reaches(api: Api, d: str, status: str) -> None:
    async def there() -> bool:
        return await _status(api, d) == status

    await wait_for(there, timeout=30, what=f"status {status}")


@pytest.mark.slow
async def test_a_degraded_or_deploying_version_queues_requests_and_says_why(tmp_path: Path) -> None:
    started = 0

    def first_runs_then_never_ready(_: CreationMessage) -> Any:
        nonlocal started
        started += 1
        return "run" if started == 1 else "start"

    async with platform(tmp_path) as p, agent(p.bus, behaviour=first_runs_then_never_ready) as fake:
        created = await p.admin.post("/v2/nvcf/functions", ECHO_FUNCTION)
        fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
        d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
        assert (await p.admin.post(d, {"deploymentSpecifications": [SPEC]})).status == 200
        await _reaches(p.admin, d, "ACTIVE")
        (running,) = fake.live()
        await fake.report(running.request_id, states.DEGRADED_WORKER, error="health check failing")
        await _reaches(p.admin, d, "DEGRADED")  # its replacement starts and never becomes ready
        reply = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}", {"message": "x"}, headers={"NVCF-POLL-SECONDS": "1"}
        )
        assert reply.status == 202, reply.body
        assert reply.headers["NVCF-WAIT-REASON"] in ("cold_starting", "instance_failing"), reply.headers
        request_id = reply.headers["NVCF-REQID"]
        poll = await p.key.get(f"/v2/nvcf/pexec/status/{request_id}", headers={"NVCF-POLL-SECONDS": "1"})
        assert poll.status == 202 and poll.headers["NVCF-REQID"] == request_id

        # The same for a version still DEPLOYING (its first instance never ready yet).
        second = await p.admin.post(f"/v2/nvcf/functions/{fid}/versions", ECHO_FUNCTION)
        vid2 = second.json["function"]["versionId"]
        d2 = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid2}"
        assert (await p.admin.post(d2, {"deploymentSpecifications": [SPEC]})).status == 200
        assert await _status(p.admin, d2) == "DEPLOYING"
        pinned = await p.key.post(
            f"/v2/nvcf/pexec/functions/{fid}/versions/{vid2}", {"message": "y"}, headers={"NVCF-POLL-SECONDS": "1"}
        )
        assert pinned.status == 202, pinned.body


@pytest.mark.slow
async def test_a_version_in_error_answers_503_with_the_reason(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus, behaviour="fail"):
        created = await p.admin.post("/v2/nvcf/functions", ECHO_FUNCTION)
        fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
        d = f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}"
        assert (await p.admin.post(d, {"deploymentSpecifications": [SPEC]})).status == 200
        await _reaches(p.admin, d, "ERROR")

        async def refused() -> Any:
            reply = await p.key.post(f"/v2/nvcf/pexec/functions/{fid}", {"message": "x"})
            return reply if reply.status == 503 else None

        reply = await wait_for(refused, timeout=10, what="the invocation node to see ERROR")
        assert "ERROR" in reply.detail and "inference server exited" in reply.detail, reply.detail
        assert "Retry-After" not in reply.headers  # nothing comes back by waiting
