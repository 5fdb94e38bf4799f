"""One account's queued requests, over all its functions, are held to its limit; other accounts queue on."""

from __future__ import annotations

from pathlib import Path

import anyio

from nvcf_mono.auth import scopes
from nvcf_mono.testing.platform import Api
from nvcf_mono.testing.running import agent, deployed, other_account_key, platform

PAD = "x" * 4000  # a request of about 4.5 KB as stored


async def queue_many(api: Api, fid: str, n: int) -> list[int]:
    """``n`` calls at once that nobody serves: each is queued (202 after its poll window) or refused."""
    statuses: list[int] = []

    async def one(i: int) -> None:
        reply = await api.post(
            f"/v2/nvcf/pexec/functions/{fid}", {"message": f"{i}", "pad": PAD}, headers={"NVCF-POLL-SECONDS": "1"}
        )
        if reply.status == 429:
            assert "account's request queues are full" in reply.detail and reply.headers["Retry-After"]
        statuses.append(reply.status)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return statuses


async def test_an_accounts_functions_together_are_held_to_its_queue_limit(tmp_path: Path) -> None:
    settings = {"plugins.invocation.account_queue_max_bytes": "64KiB"}
    async with platform(tmp_path, **settings) as p, agent(p.bus):  # a scripted agent: ACTIVE, nothing serves
        first, _ = await deployed(p.admin)
        second, _ = await deployed(p.admin)
        neighbour = p.api(await other_account_key(p, "neighbour", scopes.ACCOUNT_ADMIN_SCOPES))
        theirs, _ = await deployed(neighbour)
        assert set(await queue_many(p.key, first, 8)) == {202}  # about 36 KB: within 64 KiB
        refused = await queue_many(p.key, second, 10)  # another function of the same account
        assert 202 in refused and refused.count(429) >= 3, refused
        assert set(await queue_many(neighbour, theirs, 12)) == {202}  # its own limit, untouched
