"""How many functions, versions and assets an account keeps: held to its limits, also by requests made at once."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.testing.platform import Reply
from nvcf_mono.testing.running import CONTAINER_FUNCTION

from .conftest import agent, platform
from .test_registry_credentials import RC
from .test_tasks_api import TASK, TASKS, task_key


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


async def test_tasks_keys_and_registry_credentials_made_at_once_stay_within_the_accounts_limits(
    tmp_path: Path,
) -> None:
    settings = {"plugins.control.max_account_keys": "8", "plugins.control.tasks.max_account_tasks": "2"}
    async with platform(tmp_path, **settings) as p, agent(p.bus):
        limited = await p.admin.patch(f"/v2/nvcf/accounts/{DEFAULT_ACCOUNT}", {"maxRegistryCredentialsAllowed": 2})
        assert limited.status == 200, limited.body
        tasks = await task_key(p)
        launched = await at_once(5, lambda i: tasks.post(TASKS, {**TASK, "name": f"t{i}"}))
        assert statuses(launched) == {200: 2, 400: 3}, [r.body for r in launched]
        assert "max_account_tasks" in next(r for r in launched if r.status == 400).detail
        # Registry credentials: two hosts of four; the same host twice at once is one credential and a 409.
        added = await at_once(4, lambda i: p.admin.post(RC, credential(f"r{i}.example.com")))
        assert statuses(added) == {200: 2, 400: 2}, [r.body for r in added]
        listed = await p.admin.get(RC)
        hosts = [c["registryHostname"] for c in listed.json["registryCredentials"]]
        gone = await p.admin.delete(f"{RC}/{listed.json['registryCredentials'][0]['registryCredentialId']}")
        assert gone.status == 204, gone.body
        twice = await at_once(2, lambda i: p.admin.post(RC, credential("same.example.com")))
        assert statuses(twice) == {200: 1, 409: 1}, [r.body for r in twice]
        assert len(hosts) == 2
        # API keys: active ones, up to eight (the bootstrap and task keys among them).
        held = len([k for k in (await p.admin.get("/v1/keys")).json["keys"] if k["status"] == "ACTIVE"])
        minted = await at_once(10, lambda i: p.admin.post("/v1/admin/keys", {}))
        assert statuses(minted) == {200: 8 - held, 400: 2 + held}, [r.body for r in minted]
        assert "max_account_keys" in next(r for r in minted if r.status == 400).detail


def credential(host: str) -> dict[str, object]:
    secret = base64.b64encode(b"robot:pa55-WORD-xyz").decode()
    return {"registryHostname": host, "secret": {"name": "cred", "value": secret}, "artifactTypes": ["CONTAINER"]}


async def test_an_accounts_max_tasks_allowed_bounds_its_unfinished_tasks_not_its_kept_ones(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        limited = await p.admin.patch(f"/v2/nvcf/accounts/{DEFAULT_ACCOUNT}", {"maxTasksAllowed": 2})
        assert limited.status == 200, limited.body
        tasks = await task_key(p)
        launched = await at_once(5, lambda i: tasks.post(TASKS, {**TASK, "name": f"t{i}"}))
        assert statuses(launched) == {200: 2, 400: 3}, [r.body for r in launched]
        refused = next(r for r in launched if r.status == 400)
        assert "number of tasks allowed: 2" in refused.detail and "maxTasksAllowed" in refused.detail
        # A finished task (here canceled) is kept but no longer counts: one more may start.
        first = next(r for r in launched if r.status == 200).json["task"]["id"]
        canceled = await tasks.post(f"{TASKS}/{first}/cancel", {})
        assert canceled.status == 200, canceled.body
        again = await tasks.post(TASKS, {**TASK, "name": "again"})
        assert again.status == 200, again.body
        assert (await tasks.post(TASKS, {**TASK, "name": "one-too-many"})).status == 400
        listed = await tasks.get(TASKS + "?limit=100")
        assert len(listed.json["tasks"]) == 3
