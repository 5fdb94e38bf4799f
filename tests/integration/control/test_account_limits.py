"""How many functions, versions and assets an account keeps: held to its limits, also by requests made at once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.testing.platform import Reply
from nvcf_mono.testing.running import CONTAINER_FUNCTION

from .conftest import platform


async def at_once(n: int, make: Callable[[int], Awaitable[Reply]]) -> list[Reply]:
    replies: list[Reply] = []

    async def one(i: int) -> None:
        replies.append(await make(i))

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return replies


def statuses(replies: list[Reply]) -> dict[int, int]:
    return {status: [r.status for r in replies].count(status) for status in {r.status for r in replies}}


async def test_functions_and_versions_made_at_once_stay_within_the_accounts_limits(tmp_path: Path) -> None:
    async with platform(tmp_path, **{"plugins.control.max_account_versions": "6"}) as p:
        limited = await p.admin.patch(f"/v2/nvcf/accounts/{DEFAULT_ACCOUNT}", {"maxFunctionsAllowed": 3})
        assert limited.status == 200, limited.body
        made = await at_once(8, lambda i: p.admin.post("/v2/nvcf/functions", {**CONTAINER_FUNCTION, "name": f"f{i}"}))
        assert statuses(made) == {200: 3, 400: 5}, [r.body for r in made]
        refused = next(r for r in made if r.status == 400)
        assert "max limit for the number of functions allowed: 3" in refused.detail
        fid = next(r for r in made if r.status == 200).json["function"]["id"]
        # Three versions exist; the account may keep six over all its functions.
        more = await at_once(
            5, lambda i: p.admin.post(f"/v2/nvcf/functions/{fid}/versions", {**CONTAINER_FUNCTION, "name": f"v{i}"})
        )
        assert statuses(more) == {200: 3, 400: 2}, [r.body for r in more]
        assert "max_account_versions" in next(r for r in more if r.status == 400).detail
        listed = await p.admin.get("/v2/nvcf/functions")
        assert len(listed.json["functions"]) == 6
        # Deleting a version makes room for another.
        vid = next(r for r in more if r.status == 200).json["function"]["versionId"]
        assert (await p.admin.delete(f"/v2/nvcf/functions/{fid}/versions/{vid}")).status == 204
        again = await p.admin.post(f"/v2/nvcf/functions/{fid}/versions", {**CONTAINER_FUNCTION, "name": "again"})
        assert again.status == 200, again.body


async def test_assets_made_at_once_stay_within_the_accounts_limit(tmp_path: Path) -> None:
    async with platform(tmp_path, **{"plugins.control.max_account_assets": "3"}) as p:
        asset = {"contentType": "application/octet-stream", "description": "input"}
        made = await at_once(8, lambda i: p.key.post("/v2/nvcf/assets", asset))
        assert statuses(made) == {200: 3, 400: 5}, [r.body for r in made]
        assert "max_account_assets" in next(r for r in made if r.status == 400).detail
        listed = await p.key.get("/v2/nvcf/assets")
        assert len(listed.json["assets"]) == 3
        first = next(r for r in made if r.status == 200).json["assetId"]
        assert (await p.key.delete(f"/v2/nvcf/assets/{first}")).status == 204
        assert (await p.key.post("/v2/nvcf/assets", asset)).status == 200
