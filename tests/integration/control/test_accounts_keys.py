"""Accounts (CRUD, JWT client mapping, deletion) and API keys (mint, list, revoke, expiry, subset rules)."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from nvcf_mono.auth.keystore import API_KEY_STORE
from nvcf_mono.contracts import buckets
from nvcf_mono.models.api_key import FUNCTIONS_SERVICE_ID, TASKS_SERVICE_ID, Authorizations, Policy
from nvcf_mono.models.common import parse_iso
from nvcf_mono.plugins.auth_api_key import EXPIRED_KEPT
from nvcf_mono.testing.platform import Reply, wait_for

from .conftest import CONTAINER_FUNCTION, Platform, agent, platform

KEY_RX = re.compile(r"nvapi-[A-Za-z0-9_-]{64}")
FUNCTION_SCOPES = ["invoke_function", "list_functions", "list_functions_details", "queue_details"]
ACCOUNT_FUNCTIONS = [{"id": "*", "type": "account-functions"}]


def key_body(scopes: list[str], resources: list[dict[str, str]] | None = None, **extra: Any) -> dict[str, Any]:
    """A create-key body as NVCF's CLI writes it."""
    policy = {
        "product": "nv-cloud-functions",
        "scopes": scopes,
        "resources": ACCOUNT_FUNCTIONS if resources is None else resources,
    }
    return {"description": "test key", "authorizations": {"policies": [policy]}, **extra}


def iso_in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def assert_problem(reply: Any, status: int, *fragments: str) -> None:
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["Content-Type"].startswith("application/problem+json"), reply.headers
    doc = reply.json
    assert doc["status"] == status and doc["title"] and doc["type"].startswith("urn:nv-boot:problem-details:")
    for fragment in fragments:
        assert fragment.lower() in doc["detail"].lower(), (fragment, doc["detail"])


async def mint(p: Platform, body: dict[str, Any]) -> dict[str, Any]:
    reply = await p.admin.post("/v1/keys", body)
    assert reply.status == 200, reply.body
    doc: dict[str, Any] = reply.json
    return doc


async def new_version(p: Platform, account: str | None = None, function_id: str | None = None) -> dict[str, Any]:
    """Register a function (or a new version of one) in the admin's account or, cross-account, in another."""
    base = "/v2/nvcf" if account is None else f"/v2/nvcf/accounts/{account}"
    path = f"{base}/functions" if function_id is None else f"{base}/functions/{function_id}/versions"
    reply = await p.admin.post(path, CONTAINER_FUNCTION)
    assert reply.status == 200, reply.body
    fn: dict[str, Any] = reply.json["function"]
    return fn


# ---- accounts ---------------------------------------------------------------------------------------


async def test_account_crud_validation_and_conflicts(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await p.admin.post(
            "/v2/nvcf/accounts/team-a", {"name": "Team A", "adminClientId": "client-a", "maxFunctionsAllowed": 3}
        )
        assert created.status == 200, created.body
        account = created.json["account"]
        assert account["ncaId"] == "team-a" and account["name"] == "Team A"
        assert account["adminClientIds"] == ["client-a"]
        assert account["maxFunctionsAllowed"] == 3
        assert account["maxTasksAllowed"] == 50 and account["maxRegistryCredentialsAllowed"] == 25
        assert parse_iso(account["lastUpdatedAt"]) <= datetime.now(UTC)

        assert_problem(await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Again"}), 409, "already exists")
        assert_problem(await p.admin.post("/v2/nvcf/accounts/team-b", {}), 400, "field=name", "must not be null")
        assert_problem(await p.admin.post("/v2/nvcf/accounts/team-b", {"name": "abc"}), 400, "between 4 and 36")
        assert_problem(await p.admin.post("/v2/nvcf/accounts/team-b", {"name": "x" * 37}), 400, "between 4 and 36")
        for bad_id in ("bad.id", "x" * 129):  # ids of the path's shape, not of an account's
            assert_problem(await p.admin.post(f"/v2/nvcf/accounts/{bad_id}", {"name": "Team B"}), 400, "account id")
        for bad_id in ("bad%20id", "caf%C3%A9"):  # no id has these characters
            assert_problem(await p.admin.post(f"/v2/nvcf/accounts/{bad_id}", {"name": "Team B"}), 400, "ncaId")
        assert_problem(
            await p.admin.post("/v2/nvcf/accounts/team-b", {"name": "Team B", "maxTelemetriesAllowed": 26}),
            400,
            "maxTelemetriesAllowed",
        )
        assert_problem(
            await p.admin.post("/v2/nvcf/accounts/team-b", {"name": "Team B", "registryCredentials": [{}]}),
            400,
            "registryCredentials",
        )
        # A client id (JWT sub) maps to one account only.
        assert_problem(
            await p.admin.post("/v2/nvcf/accounts/team-b", {"name": "Team B", "adminClientId": "client-a"}),
            409,
            "client-a",
            "team-a",
        )
        assert (await p.admin.get("/v2/nvcf/accounts/team-b")).status == 404
        assert (await p.admin.post("/v2/nvcf/accounts/team_b", {"name": "Team B"})).status == 200

        listed = await p.admin.get("/v2/nvcf/accounts")
        assert listed.status == 200
        assert [a["ncaId"] for a in listed.json["cloudAccounts"]] == ["nvcf-default", "team-a", "team_b"]
        got = await p.admin.get("/v2/nvcf/accounts/team-a")
        assert got.status == 200 and got.json["account"] == account
        assert_problem(await p.admin.get("/v2/nvcf/accounts/nobody"), 404, "nobody")

        patched = await p.admin.patch("/v2/nvcf/accounts/team-a", {"name": "Team Alpha", "maxFunctionsAllowed": 7})
        assert patched.status == 200, patched.body
        assert patched.json["account"]["name"] == "Team Alpha"
        assert patched.json["account"]["maxFunctionsAllowed"] == 7
        assert patched.json["account"]["adminClientIds"] == ["client-a"]
        assert_problem(await p.admin.patch("/v2/nvcf/accounts/team-a", {}), 400, "at least one")
        assert_problem(await p.admin.patch("/v2/nvcf/accounts/team-a", {"name": "ab"}), 400, "between 4 and 36")
        assert_problem(await p.admin.patch("/v2/nvcf/accounts/nobody", {"name": "Nobody"}), 404, "nobody")
        assert_problem(await p.admin.patch("/v2/nvcf/accounts/team_b", {"adminClientId": "client-a"}), 409, "client-a")

        # The limit is enforced by function registration.
        limited = await p.admin.patch("/v2/nvcf/accounts/team_b", {"maxFunctionsAllowed": 1})
        assert limited.status == 200
        await new_version(p, "team_b")
        over = await p.admin.post("/v2/nvcf/accounts/team_b/functions", CONTAINER_FUNCTION)
        assert_problem(over, 400, "max limit for the number of functions allowed: 1")

        # Credentials without account_setup are refused, on every account route.
        for method, path, body in (
            ("GET", "/v2/nvcf/accounts", None),
            ("POST", "/v2/nvcf/accounts/team-c", {"name": "Team C"}),
            ("GET", "/v2/nvcf/accounts/team-a", None),
            ("PATCH", "/v2/nvcf/accounts/team-a", {"name": "Mine Now"}),
            ("DELETE", "/v2/nvcf/accounts/team-a", None),
            ("PATCH", "/v2/nvcf/accounts/team-a/clients/associate", {"clientIds": ["me"]}),
            ("PATCH", "/v2/nvcf/accounts/team-a/clients/disassociate", {"clientIds": ["client-a"]}),
        ):
            assert_problem(await p.key.call(method, path, body), 403, "account_setup")
        assert (await p.admin.get("/v2/nvcf/accounts/team-a")).json["account"]["name"] == "Team Alpha"


async def test_client_mapping_is_stored_and_exclusive(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        assert (await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Team A"})).status == 200
        assert (await p.admin.post("/v2/nvcf/accounts/team-b", {"name": "Team B"})).status == 200
        a = "/v2/nvcf/accounts/team-a/clients"
        associated = await p.admin.patch(f"{a}/associate", {"clientIds": ["svc-1", "svc-2", "svc-1"]})
        assert associated.status == 200, associated.body
        assert associated.json["account"]["adminClientIds"] == ["svc-1", "svc-2"]
        again = await p.admin.patch(f"{a}/associate", {"clientIds": ["svc-2", "svc-3"]})
        assert again.json["account"]["adminClientIds"] == ["svc-1", "svc-2", "svc-3"]

        # What the JWT strategy reads: the stored account record.
        entry = await p.bus.kv(buckets.ACCOUNTS.name).get("team-a")
        assert entry is not None
        stored = buckets.ACCOUNT.decode(entry.value)
        assert stored.admin_client_ids == ("svc-1", "svc-2", "svc-3")
        assert json.loads(entry.value)["data"]["adminClientIds"] == ["svc-1", "svc-2", "svc-3"]

        taken = await p.admin.patch("/v2/nvcf/accounts/team-b/clients/associate", {"clientIds": ["new", "svc-3"]})
        assert_problem(taken, 409, "svc-3", "team-a")
        unchanged = await p.admin.get("/v2/nvcf/accounts/team-b")
        assert unchanged.json["account"]["adminClientIds"] == []

        removed = await p.admin.patch(f"{a}/disassociate", {"clientIds": ["svc-3", "svc-1"]})
        assert removed.status == 200
        assert removed.json["account"]["adminClientIds"] == ["svc-2"]
        assert_problem(await p.admin.patch(f"{a}/disassociate", {"clientIds": ["svc-9"]}), 400, "svc-9")
        # Free again: another account may take it.
        moved = await p.admin.patch("/v2/nvcf/accounts/team-b/clients/associate", {"clientIds": ["svc-3"]})
        assert moved.status == 200 and moved.json["account"]["adminClientIds"] == ["svc-3"]

        assert_problem(await p.admin.patch(f"{a}/associate", {"clientIds": []}), 400, "clientIds")
        assert_problem(await p.admin.patch(f"{a}/associate", {"clientIds": ["has space"]}), 400, "clientIds")
        assert_problem(await p.admin.patch(f"{a}/associate", {}), 400, "clientIds", "required")
        assert_problem(
            await p.admin.patch("/v2/nvcf/accounts/nobody/clients/associate", {"clientIds": ["x"]}), 404, "nobody"
        )


async def test_account_delete_rules_and_cleanup(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        assert_problem(await p.admin.delete("/v2/nvcf/accounts/nvcf-default"), 400, "default account")
        assert (await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Team A"})).status == 200
        fn = await new_version(p, "team-a")
        assert_problem(await p.admin.delete("/v2/nvcf/accounts/team-a"), 400, "1 function version")

        # Another account's function shared with team-a: the share goes with the account.
        shared = await new_version(p)
        share = await p.admin.post(
            f"/v2/nvcf/authorizations/functions/{shared['id']}", {"authorizedParties": [{"ncaId": "team-a"}]}
        )
        assert share.status == 200, share.body
        key = await mint(p, key_body(["list_functions"], nca_id="team-a"))
        team_key = p.api(key["value"])
        assert (await team_key.get("/v2/nvcf/functions")).status == 200
        # What else it owns goes with it: registry credentials, assets and their content.
        cred = await p.admin.post(
            "/v2/nvcf/accounts/team-a/registry-credentials",
            {
                "registryHostname": "registry.example.com",
                "secret": {"name": "robot", "value": base64.b64encode(b"robot:secret-pass").decode()},
                "artifactTypes": ["CONTAINER"],
            },
        )
        assert cred.status == 200, cred.body
        asset = await p.admin.post(
            "/v2/nvcf/accounts/team-a/assets", {"contentType": "text/plain", "description": "input"}
        )
        assert asset.status == 200, asset.body
        async with p.anonymous.session.put(
            asset.json["uploadUrl"], data=b"hello", headers={"Content-Type": "text/plain"}
        ) as put:
            assert put.status == 200, await put.text()
        content = p.bus.objects(buckets.ASSET_CONTENT.name)
        stored_object = buckets.asset_object("team-a", asset.json["assetId"])
        assert await content.info(stored_object) is not None

        deleted_fn = await p.admin.delete(f"/v2/nvcf/accounts/team-a/functions/{fn['id']}/versions/{fn['versionId']}")
        assert deleted_fn.status == 204, deleted_fn.body
        gone = await p.admin.delete("/v2/nvcf/accounts/team-a")
        assert gone.status == 204, gone.body
        assert_problem(await p.admin.get("/v2/nvcf/accounts/team-a"), 404)
        assert_problem(await p.admin.delete("/v2/nvcf/accounts/team-a"), 404)
        # Its keys stop working at once; the share no longer names it.
        assert_problem(await team_key.get("/v2/nvcf/functions"), 401, "revoked")
        assert await p.bus.kv(buckets.AUTHORIZATIONS.name).get(shared["id"]) is None
        for bucket in (buckets.REGISTRY_CREDENTIALS, buckets.ASSETS):
            assert [k for k in await p.bus.kv(bucket.name).keys() if k.startswith("team-a.")] == []
        assert await content.info(stored_object) is None
        # The id is free again, and the new account starts empty.
        assert (await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Team A Again"})).status == 200
        assert (await p.admin.get("/v2/nvcf/accounts/team-a/registry-credentials")).json["registryCredentials"] == []


async def test_account_deployments_for_super_admins(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        empty = await p.admin.get("/v2/nvcf/accounts/nvcf-default/deployments")
        assert empty.status == 200 and empty.json == {"deployments": []}
        fn = await new_version(p)
        deployed = await p.admin.post(
            f"/v2/nvcf/deployments/functions/{fn['id']}/versions/{fn['versionId']}",
            {
                "deploymentSpecifications": [
                    {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 0, "maxInstances": 1}
                ]
            },
        )
        assert deployed.status == 200, deployed.body
        listed = await p.admin.get("/v2/nvcf/accounts/nvcf-default/deployments")
        assert listed.status == 200
        [dep] = listed.json["deployments"]
        assert dep["functionId"] == fn["id"] and dep["functionVersionId"] == fn["versionId"]
        assert dep["deploymentSpecifications"][0]["gpu"] == "H100"
        assert (await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Team A"})).status == 200
        other = await p.admin.get("/v2/nvcf/accounts/team-a/deployments")
        assert other.json == {"deployments": []}
        assert_problem(await p.admin.get("/v2/nvcf/accounts/nobody/deployments"), 404, "nobody")
        assert_problem(await p.key.get("/v2/nvcf/accounts/nvcf-default/deployments"), 403, "admin:deploy_function")


# ---- keys -------------------------------------------------------------------------------------------


async def test_key_create_list_get_revoke(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        before = datetime.now(UTC)
        created = await mint(p, key_body(FUNCTION_SCOPES, ACCOUNT_FUNCTIONS))
        assert KEY_RX.fullmatch(created["value"]), created["value"]
        assert created["status"] == "ACTIVE" and created["owner_type"] == "USER" and created["owner_id"] == "admin"
        assert created["nca_id"] == "nvcf-default"
        assert created["issuer_service_id"] == FUNCTIONS_SERVICE_ID
        assert created["audience_service_ids"] == [FUNCTIONS_SERVICE_ID]
        assert created["masked_key"].startswith("nvapi-**********")
        [policy] = created["authorizations"]["policies"]
        assert policy["aud"] == FUNCTIONS_SERVICE_ID and policy["auds"] == [FUNCTIONS_SERVICE_ID]
        assert policy["scopes"] == FUNCTION_SCOPES and policy["resources"] == ACCOUNT_FUNCTIONS
        # Default lifetime: 24 hours.
        lifetime = parse_iso(created["expires_at"]) - before
        assert timedelta(hours=23, minutes=59) < lifetime <= timedelta(hours=24, seconds=5)

        user = p.api(created["value"])
        assert (await user.get("/v2/nvcf/functions")).status == 200
        assert_problem(await user.post("/v2/nvcf/functions", CONTAINER_FUNCTION), 403, "register_function")

        listed = await p.admin.get("/v1/keys")
        assert listed.status == 200
        mine = [k for k in listed.json["keys"] if k["id"] == created["id"]]
        assert len(mine) == 1
        assert "value" not in mine[0] and "authorizations" not in mine[0]
        assert mine[0]["description"] == "test key"
        # The bootstrap keys are there too: every key of the account.
        assert {k["description"] for k in listed.json["keys"]} >= {"bootstrap function key", "bootstrap task key"}

        got = await p.admin.get(f"/v1/keys/{created['id']}")
        assert got.status == 200
        assert "value" not in got.json
        assert got.json["authorizations"] == created["authorizations"]

        # Exact expiry is kept as given.
        at = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
        exact = await mint(p, key_body(["list_functions"], expires_at=at.isoformat().replace("+00:00", "Z")))
        assert parse_iso(exact["expires_at"]) == at

        revoked = await p.admin.delete(f"/v1/keys/{created['id']}")
        assert revoked.status == 204
        assert_problem(await user.get("/v2/nvcf/functions"), 401, "revoked")
        assert_problem(await p.admin.get(f"/v1/keys/{created['id']}"), 404)
        assert_problem(await p.admin.delete(f"/v1/keys/{created['id']}"), 404)
        assert created["id"] not in {k["id"] for k in (await p.admin.get("/v1/keys")).json["keys"]}


@pytest.mark.slow
async def test_expired_key_is_refused(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await mint(p, key_body(["list_functions"], expires_at=iso_in(2)))
        user = p.api(created["value"])
        assert (await user.get("/v2/nvcf/functions")).status == 200

        async def refused() -> Any:
            reply = await user.get("/v2/nvcf/functions")
            return reply if reply.status == 401 else None

        reply = await wait_for(refused, timeout=10, what="the key to expire")
        assert_problem(reply, 401, "expired")
        shown = await p.admin.get(f"/v1/keys/{created['id']}")
        assert shown.json["status"] == "EXPIRED"


async def test_key_validation(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:

        async def refused(body: dict[str, Any], status: int, *fragments: str) -> None:
            assert_problem(await p.admin.post("/v1/keys", body), status, *fragments)

        await refused(key_body(["list_functions"], description="bad!"), 400, "description")
        await refused(key_body(["list_functions"], description="x" * 65), 400, "description")
        await refused({"authorizations": {"policies": []}}, 400, "description", "required")
        await refused(key_body(["list_functions"], expires_at=iso_in(-60)), 400, "future")
        await refused(key_body(["list_functions"], expires_at=iso_in(400 * 86400)), 400, "at most 365 days")
        await refused(key_body(["list_functions"], expires_at="next tuesday"), 400, "ISO-8601")
        await refused({"description": "no policies"}, 400, "at least one policy")
        await refused({"description": "empty", "authorizations": {"policies": [{"scopes": []}]}}, 400, "scope")
        await refused(key_body(["list_functions", "fly", "admin:fly"]), 400, "Unknown scopes: fly, admin:fly")
        await refused(key_body(["apikey:list_functions"]), 400, "without the 'apikey:' prefix")
        await refused(key_body(["list_functions"], [{"id": "*", "type": "galaxy"}]), 400, "galaxy")
        await refused(key_body(["list_functions"], [{"id": "abc", "type": "function"}]), 400, "<functionId>/")
        await refused(key_body(["list_functions"], [{"id": "x", "type": "account-functions"}]), 400, "account-")
        await refused(key_body(["list_functions"], audience_service_ids=[]), 400, "audience_service_ids")
        await refused(key_body(["list_functions"], audience_service_ids=["someone"]), 400, "audience_service_ids")
        wrong_aud = key_body(["list_functions"])
        wrong_aud["authorizations"]["policies"][0]["aud"] = TASKS_SERVICE_ID
        await refused(wrong_aud, 400, "aud")
        await refused(key_body(["list_functions"], nca_id="nobody"), 404, "nobody")
        await refused(key_body(["list_functions"], nca_id="bad.id"), 400, "nca_id")
        # A function resource must be reachable by the account the key is for.
        await refused(key_body(["list_functions"], [{"id": f"{uuid.uuid4()}/*", "type": "function"}]), 403, "function:")

        # A task key: audiences follow the product.
        task = await mint(
            p,
            {
                "description": "tasks",
                "authorizations": {
                    "policies": [
                        {
                            "product": "nv-cloud-tasks",
                            "scopes": ["launch_task"],
                            "resources": [{"id": "*", "type": "account-tasks"}],
                        }
                    ]
                },
            },
        )
        assert task["issuer_service_id"] == TASKS_SERVICE_ID and task["audience_service_ids"] == [TASKS_SERVICE_ID]


async def test_api_key_callers_cannot_manage_keys(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        keys = (await p.admin.get("/v1/keys")).json["keys"]
        for reply in (
            await p.key.post("/v1/keys", key_body(["list_functions"])),
            await p.key.get("/v1/keys"),
            await p.key.get(f"/v1/keys/{keys[0]['id']}"),
            await p.key.delete(f"/v1/keys/{keys[0]['id']}"),
        ):
            assert_problem(reply, 403, "admin credential", "an API key cannot")
        assert_problem(await p.anonymous.get("/v1/keys"), 401)
        assert len((await p.admin.get("/v1/keys")).json["keys"]) == len(keys)


async def test_super_admin_mints_for_another_account(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        assert (await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Team A"})).status == 200
        theirs = await new_version(p, "team-a")
        ours = await new_version(p)
        # Resources are checked against the target account: its function, not ours.
        assert_problem(
            await p.admin.post(
                "/v1/keys",
                key_body(["list_functions"], [{"id": f"{ours['id']}/*", "type": "function"}], nca_id="team-a"),
            ),
            403,
            f"function:{ours['id']}/*",
        )
        key = await mint(
            p,
            key_body(["list_functions"], [{"id": f"{theirs['id']}/*", "type": "function"}], nca_id="team-a"),
        )
        assert key["nca_id"] == "team-a"
        user = p.api(key["value"])
        seen = await user.get("/v2/nvcf/functions")
        assert [f["id"] for f in seen.json["functions"]] == [theirs["id"]]
        listed = await p.admin.get("/v1/keys", params={"nca_id": "team-a"})
        assert [k["id"] for k in listed.json["keys"]] == [key["id"]]
        assert key["id"] not in {k["id"] for k in (await p.admin.get("/v1/keys")).json["keys"]}
        assert_problem(await p.admin.get("/v1/keys", params={"nca_id": "nobody"}), 404, "nobody")


async def test_resource_restricted_key(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        v1 = await new_version(p)
        v2 = await new_version(p, function_id=v1["id"])
        g = await new_version(p)
        assert (await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Team A"})).status == 200
        foreign = await new_version(p, "team-a")
        key = await mint(
            p,
            key_body(
                ["list_functions", "list_functions_details"],
                [{"id": f"{v1['id']}/{v1['versionId']}", "type": "function"}],
            ),
        )
        user = p.api(key["value"])
        reached = await user.get(f"/v2/nvcf/functions/{v1['id']}/versions/{v1['versionId']}")
        assert reached.status == 200 and reached.json["function"]["versionId"] == v1["versionId"]
        assert_problem(await user.get(f"/v2/nvcf/functions/{v1['id']}/versions/{v2['versionId']}"), 403)
        versions = await user.get(f"/v2/nvcf/functions/{v1['id']}/versions")
        assert [f["versionId"] for f in versions.json["functions"]] == [v1["versionId"]]
        assert_problem(await user.get(f"/v2/nvcf/functions/{g['id']}/versions"), 403)
        listed = await user.get("/v2/nvcf/functions")
        assert [f["versionId"] for f in listed.json["functions"]] == [v1["versionId"]]
        assert_problem(await user.get(f"/v2/nvcf/functions/{foreign['id']}/versions/{foreign['versionId']}"), 404)
        assert_problem(await user.get(f"/v2/nvcf/functions/{foreign['id']}/versions"), 404)

        wildcard = await mint(p, key_body(["list_functions"], [{"id": f"{v1['id']}/*", "type": "function"}]))
        both = await p.api(wildcard["value"]).get(f"/v2/nvcf/functions/{v1['id']}/versions")
        assert sorted(f["versionId"] for f in both.json["functions"]) == sorted([v1["versionId"], v2["versionId"]])


# ---- JWTs -------------------------------------------------------------------------------------------


class Issuer:
    """A local ES256 issuer: a JWKS file the platform trusts, and tokens signed with its key."""

    def __init__(self, directory: Path, name: str = "test-issuer") -> None:
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key()))
        jwk.update({"kid": "k1", "use": "sig", "alg": "ES256"})
        self.jwks = directory / "jwks.json"
        self.jwks.write_text(json.dumps({"keys": [jwk]}))

    def settings(self) -> dict[str, str]:
        return {"plugins.auth_jwt.issuers": f"[{{issuer: {self.name}, jwks_file: {self.jwks}}}]"}

    def token(self, sub: str, scopes: list[str], *, ttl: float = 600, iss: str | None = None) -> str:
        now = int(time.time())
        claims = {"iss": iss or self.name, "sub": sub, "scopes": scopes, "iat": now, "exp": now + int(ttl)}
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": "k1"})


async def test_jwt_auth_and_grant_subset(tmp_path: Path) -> None:
    issuer = Issuer(tmp_path)
    async with platform(tmp_path, **issuer.settings()) as p:
        mapped = await p.admin.patch("/v2/nvcf/accounts/nvcf-default/clients/associate", {"clientIds": ["alice"]})
        assert mapped.status == 200
        scopes = ["list_functions", "invoke_function", "register_function"]
        alice = p.api(issuer.token("alice", scopes))
        assert (await alice.get("/v2/nvcf/functions")).status == 200
        assert_problem(await alice.get("/v2/nvcf/accounts"), 403, "account_setup")

        # Bad JWTs.
        probe = f"/v2/nvcf/functions/{uuid.uuid4()}/versions/{uuid.uuid4()}"
        assert_problem(await p.api(issuer.token("alice", scopes, iss="elsewhere")).get(probe), 401, "issuer")
        assert_problem(await p.api(issuer.token("alice", scopes, ttl=-120)).get(probe), 401, "expired")
        assert_problem(await p.api(issuer.token("mallory", scopes)).get(probe), 404, "Unknown client_id")
        (tmp_path / "forged").mkdir()
        forged = Issuer(tmp_path / "forged")
        assert_problem(await p.api(forged.token("alice", scopes, iss=issuer.name)).get(probe), 401, "invalid JWT")

        # Within what it holds, a JWT mints keys for its own account.
        minted = await alice.post("/v1/keys", key_body(["list_functions", "invoke_function"]))
        assert minted.status == 200, minted.body
        assert minted.json["owner_id"] == "alice" and minted.json["nca_id"] == "nvcf-default"
        assert (await p.api(minted.json["value"]).get("/v2/nvcf/functions")).status == 200
        assert_problem(
            await alice.post("/v1/keys", key_body(["list_functions", "deploy_function", "update_function"])),
            403,
            "does not hold: deploy_function, update_function",
        )
        assert_problem(await alice.post("/v1/keys", key_body(["admin:list_functions"])), 403, "admin:list_functions")
        assert_problem(await alice.post("/v1/keys", key_body(["teleport"])), 400, "Unknown scopes: teleport")

        # Resources: its account's functions, not another account's.
        own = await alice.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
        assert own.status == 200, own.body
        fid, vid = own.json["function"]["id"], own.json["function"]["versionId"]
        assert (await p.admin.post("/v2/nvcf/accounts/team-a", {"name": "Team A"})).status == 200
        foreign = await new_version(p, "team-a")
        ok = await alice.post("/v1/keys", key_body(["list_functions"], [{"id": f"{fid}/{vid}", "type": "function"}]))
        assert ok.status == 200, ok.body
        refused = await alice.post(
            "/v1/keys", key_body(["list_functions"], [{"id": f"{foreign['id']}/*", "type": "function"}])
        )
        assert_problem(refused, 403, f"function:{foreign['id']}/*", "nvcf-default")
        # Shared with its account: then it may.
        share = await p.admin.post(
            f"/v2/nvcf/accounts/team-a/authorizations/functions/{foreign['id']}",
            {"authorizedParties": [{"ncaId": "nvcf-default"}]},
        )
        assert share.status == 200, share.body
        shared = await alice.post(
            "/v1/keys",
            key_body(
                ["list_functions"],
                [{"id": "*", "type": "authorized-functions"}, {"id": f"{foreign['id']}/*", "type": "function"}],
            ),
        )
        assert shared.status == 200, shared.body

        # Other accounts are out of reach without super-admin scopes.
        assert_problem(await alice.post("/v1/keys", key_body(["list_functions"], nca_id="team-a")), 403, "super admin")
        assert_problem(await alice.get("/v1/keys", params={"nca_id": "team-a"}), 403, "super admin")
        theirs = await mint(p, key_body(["list_functions"], nca_id="team-a"))
        assert_problem(await alice.get(f"/v1/keys/{theirs['id']}"), 404)
        assert_problem(await alice.delete(f"/v1/keys/{theirs['id']}"), 404)
        listed = await alice.get("/v1/keys")
        assert listed.status == 200
        assert {k["nca_id"] for k in listed.json["keys"]} == {"nvcf-default"}
        assert minted.json["id"] in {k["id"] for k in listed.json["keys"]}
        # And revokes its account's keys.
        assert (await alice.delete(f"/v1/keys/{minted.json['id']}")).status == 204
        assert_problem(await p.api(minted.json["value"]).get("/v2/nvcf/functions"), 401, "revoked")

        # Mapping a client elsewhere moves its (new) tokens to that account.
        moved = await p.admin.patch("/v2/nvcf/accounts/team-a/clients/associate", {"clientIds": ["bob"]})
        assert moved.status == 200
        bob = p.api(issuer.token("bob", ["list_functions"]))

        async def moved_over() -> Reply | None:
            # The JWT strategy reads account mappings from its mirror of the accounts bucket: soon, not at once.
            reply = await bob.get("/v2/nvcf/functions")
            return reply if reply.status == 200 else None

        seen = await wait_for(moved_over, what="bob's tokens to act for team-a")
        assert [f["id"] for f in seen.json["functions"]] == [foreign["id"]]


async def test_a_keys_authorizations_are_replaced_and_take_effect_at_once(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await mint(p, key_body(["list_functions"]))
        user = p.api(created["value"])
        assert (await user.get("/v2/nvcf/functions")).status == 200
        assert_problem(await user.post("/v2/nvcf/functions", CONTAINER_FUNCTION), 403, "register_function")

        wider = {"policies": key_body(["list_functions", "register_function"])["authorizations"]["policies"]}
        put = await p.admin.put(f"/v1/keys/{created['id']}/authorizations", wider)
        assert put.status == 200, put.body
        assert put.json["authorizations"]["policies"][0]["scopes"] == ["list_functions", "register_function"]
        assert put.json["id"] == created["id"] and "value" not in put.json
        assert (await user.post("/v2/nvcf/functions", CONTAINER_FUNCTION)).status == 200  # the same key, now
        shown = await p.admin.get(f"/v1/keys/{created['id']}")
        assert shown.json["authorizations"] == put.json["authorizations"]

        narrower = {"policies": key_body(["invoke_function"])["authorizations"]["policies"]}
        assert (await p.admin.put(f"/v1/keys/{created['id']}/authorizations", narrower)).status == 200
        assert_problem(await user.get("/v2/nvcf/functions"), 403, "list_functions")

        # What cannot be done: an unknown key, another service, nothing, more than an API key may manage.
        path = f"/v1/keys/{created['id']}/authorizations"
        assert_problem(await p.admin.put(f"/v1/keys/{uuid.uuid4()}/authorizations", narrower), 404)
        tasks = {"policies": [{"product": "nv-cloud-tasks", "scopes": ["list_tasks"], "resources": []}]}
        assert_problem(await p.admin.put(path, tasks), 400, "not for", TASKS_SERVICE_ID)
        assert_problem(await p.admin.put(path, {"policies": []}), 400, "at least one policy")
        assert_problem(await p.admin.put(path, {"policies": [{"scopes": ["teleport"]}]}), 400, "Unknown scopes")
        assert_problem(await user.put(path, narrower), 403, "admin credential")
        assert_problem(await p.anonymous.put(path, narrower), 401)


async def test_services_introspect_and_evaluate_keys(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await mint(p, key_body(FUNCTION_SCOPES))
        key = created["value"]
        anyone = p.anonymous  # the key is the credential asked about: no bearer

        seen = await anyone.post("/v1/introspect", {"audience_service_id": FUNCTIONS_SERVICE_ID, "key": key})
        assert seen.status == 200, seen.body
        assert seen.json == {
            "owner_type": "USER",
            "owner_id": "admin",
            "key_id": created["id"],
            "issuer_service_id": FUNCTIONS_SERVICE_ID,
            "authorizations": created["authorizations"],
            "nca_id": "nvcf-default",
        }
        bad_audience = {"audience_service_id": TASKS_SERVICE_ID, "key": key}
        assert_problem(await anyone.post("/v1/introspect", bad_audience), 400, "audience_service_id invalid")
        assert_problem(
            await anyone.post("/v1/introspect", {"audience_service_id": FUNCTIONS_SERVICE_ID, "key": ""}), 400, "empty"
        )
        for malformed in ("nvapi-short", "Bearer " + key, key[:-1] + ("A" if key[-1] != "A" else "B")):
            reply = await anyone.post("/v1/introspect", {"audience_service_id": FUNCTIONS_SERVICE_ID, "key": malformed})
            assert_problem(reply, 400, "api key format invalid")

        evaluation = "/v1/namespaces/nvcf/evaluations/apikey.allow"
        allowed = await anyone.post(evaluation, {"input": {"apiKey": key}})
        assert allowed.status == 200 and allowed.headers["Cache-Control"] == "max-age=60"
        assert allowed.json["namespace"] == "nvcf" and allowed.json["rule_name"] == "apikey.allow"
        result = allowed.json["result"]
        assert (result["allowed"], result["ncaId"], result["ownerId"]) == (True, "nvcf-default", "admin")
        assert result["policy"] == created["authorizations"]["policies"][0]
        # Another service's namespace, a malformed key: not allowed, still 200.
        for path, value in (("/v1/namespaces/nvct/evaluations/apikey.allow", key), (evaluation, "nvapi-nope")):
            refused = await anyone.post(path, {"input": {"apiKey": value}})
            assert refused.status == 200 and refused.json["result"] == {"allowed": False}
        assert_problem(
            await anyone.post("/v1/namespaces/elsewhere/evaluations/apikey.allow", {"input": {"apiKey": key}}),
            400,
            "namespace",
        )
        assert_problem(
            await anyone.post("/v1/namespaces/nvcf/evaluations/apikey", {"input": {"apiKey": key}}), 400, ".allow"
        )

        # A revoked key: gone for both.
        assert (await p.admin.delete(f"/v1/keys/{created['id']}")).status == 204
        gone = await anyone.post("/v1/introspect", {"audience_service_id": FUNCTIONS_SERVICE_ID, "key": key})
        assert_problem(gone, 404, "Key not found")
        assert (await anyone.post(evaluation, {"input": {"apiKey": key}})).json["result"] == {"allowed": False}


async def test_an_admin_key_manages_the_accounts_functions_for_twelve_hours(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await p.admin.post("/v1/admin/keys", {})
        assert created.status == 200, created.body
        doc = created.json
        assert doc["value"].startswith("nvapi-") and doc["status"] == "ACTIVE" and doc["nca_id"] == "nvcf-default"
        lifetime = parse_iso(doc["expires_at"]) - parse_iso(doc["created_at"])
        assert timedelta(hours=11, minutes=59) <= lifetime <= timedelta(hours=12, minutes=1)
        (policy,) = doc["authorizations"]["policies"]
        assert "deploy_function" in policy["scopes"] and "cluster-management" in policy["scopes"]
        assert "invoke_function" not in policy["scopes"]
        admin_key = p.api(doc["value"])
        registered = await admin_key.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
        assert registered.status == 200, registered.body
        assert (await admin_key.get("/v2/nvcf/functions")).status == 200
        # It manages functions, not keys; and it is listed among the account's keys.
        assert_problem(await admin_key.post("/v1/admin/keys", {}), 403, "admin credential")
        assert doc["id"] in {k["id"] for k in (await p.admin.get("/v1/keys")).json["keys"]}
        # An API key cannot mint one; no body is the same as {}; another account is for super admins.
        assert_problem(await p.key.post("/v1/admin/keys", {}), 403, "admin credential")
        assert (await p.admin.call("POST", "/v1/admin/keys")).status == 200
        assert_problem(await p.admin.post("/v1/admin/keys", {"nca_id": "no-such-team"}), 404)
        assert_problem(await p.anonymous.post("/v1/admin/keys", {}), 401)


async def test_keys_expired_long_ago_are_removed_and_recent_ones_stay_listed(tmp_path: Path) -> None:
    """Expired key records used to be kept for ever: the bucket grew with every key minted."""
    async with platform(tmp_path) as p:
        store = p.host.services.get(API_KEY_STORE)
        now = datetime.now(UTC)
        made = {}
        for name, expires in (("old", now - timedelta(days=31)), ("recent", now - timedelta(days=1))):
            record, _ = await store.create(
                nca_id="nvcf-default",
                owner_id="tests",
                description=name,
                authorizations=Authorizations(policies=(Policy(scopes=("invoke_function",)),)),
                expires_at=expires,
                issuer_service_id=FUNCTIONS_SERVICE_ID,
                audience_service_ids=(FUNCTIONS_SERVICE_ID,),
            )
            made[name] = record.id
        assert await store.remove_expired(EXPIRED_KEPT) == 1
        listed = {k["id"]: k["status"] for k in (await p.admin.get("/v1/keys")).json["keys"]}
        assert made["old"] not in listed and listed[made["recent"]] == "EXPIRED"
        assert "ACTIVE" in listed.values()  # the keys that work stay
        assert len(await p.bus.kv(buckets.API_KEYS.name).keys()) == len(listed)
