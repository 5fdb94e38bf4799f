"""Delegation tokens: a client given one may invoke the functions it names, and nothing else, until it
expires or the API key that minted it changes.

Real processes: the platform on its own NATS, and instances (the test echo server and
``nvcf-mono worker``) started by a scripted agent.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from nvcf_mono.testing.platform import Api
from nvcf_mono.testing.running import (
    ECHO_FUNCTION,
    Platform,
    deployed,
    launching_agent,
    platform,
    two_invocation_nodes,
)
from tests.support.tampering import altered

pytestmark = pytest.mark.slow

MIRROR = {**ECHO_FUNCTION, "name": "mirror", "inferenceUrl": "/echo-request"}
ACCOUNT_FUNCTIONS = [{"type": "account-functions", "id": "*"}]
TOKENS = "/v2/nvcf/tokens/functions"


def problem(reply: Any, status: int, fragment: str = "") -> None:
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["Content-Type"].startswith("application/problem+json"), reply.headers
    assert fragment.lower() in reply.json["detail"].lower(), (fragment, reply.json["detail"])


async def key(p: Platform, scopes: list[str], *, expires_in: float = 3600) -> dict[str, Any]:
    expires = (datetime.now(UTC) + timedelta(seconds=expires_in)).isoformat().replace("+00:00", "Z")
    policy = {"product": "nv-cloud-functions", "scopes": scopes, "resources": ACCOUNT_FUNCTIONS}
    body = {"description": "delegating key", "expires_at": expires, "authorizations": {"policies": [policy]}}
    reply = await p.admin.post("/v1/keys", body)
    assert reply.status == 200, reply.body
    created: dict[str, Any] = reply.json
    return created


async def token(api: Api, path: str, body: dict[str, Any]) -> tuple[Api, int]:
    reply = await api.post(path, body)
    assert reply.status == 200, reply.body
    assert set(reply.json) == {"access_token", "expires_in"}
    return api.as_(reply.json["access_token"]), reply.json["expires_in"]


async def test_a_delegation_token_invokes_what_it_names_and_nothing_more(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        mirror, mirror_v = await deployed(p.admin, MIRROR)
        echo, _ = await deployed(p.admin, ECHO_FUNCTION)
        minter = p.api((await key(p, ["invoke_function", "list_functions"]))["value"])

        partner, ttl = await token(minter, f"{TOKENS}/{mirror}", {"clientId": "partner-app"})
        assert 3590 <= ttl <= 3600
        called = await partner.post(f"/v2/nvcf/pexec/functions/{mirror}", {"x": 1})
        assert called.status == 200, called.body
        # The function sees the client the token was given to as its caller.
        assert called.json["headers"]["NVCF-SUB"] == "partner-app"
        # And the accepting node's region, whatever the caller claimed.
        forged = await partner.post(
            f"/v2/nvcf/pexec/functions/{mirror}", {}, headers={"NVCF-INVOCATION-REGION": "moon-base-1"}
        )
        assert forged.json["headers"]["NVCF-INVOCATION-REGION"] == p.host.settings.node.region
        pinned = await partner.post(f"/v2/nvcf/pexec/functions/{mirror}/versions/{mirror_v}", {"x": 1})
        assert pinned.status == 200, pinned.body

        # Nothing else: another function of the account, other scopes, minting more, managing keys.
        problem(await partner.post(f"/v2/nvcf/pexec/functions/{echo}", {"message": "m"}), 403, "does not grant")
        problem(await partner.get("/v2/nvcf/functions"), 403, "list_functions")
        problem(await partner.post(f"{TOKENS}/{mirror}", {"clientId": "again"}), 403, "cannot mint")
        problem(await partner.get("/v1/keys"), 403)

        # A version's token reaches that version; one token may name up to four functions.
        versioned, _ = await token(minter, f"{TOKENS}/{mirror}/versions/{mirror_v}", {"clientId": "v-only"})
        assert (await versioned.post(f"/v2/nvcf/pexec/functions/{mirror}/versions/{mirror_v}", {})).status == 200
        problem(await versioned.post(f"/v2/nvcf/pexec/functions/{echo}", {"message": "m"}), 403)
        pair = [{"functionId": mirror, "functionVersionId": mirror_v}, {"functionId": echo}]
        both, _ = await token(minter, TOKENS, {"clientId": "both", "functions": pair})
        assert (await both.post(f"/v2/nvcf/pexec/functions/{mirror}", {})).status == 200
        echoed = await both.post(f"/v2/nvcf/pexec/functions/{echo}", {"message": "hi"})
        assert echoed.status == 200 and echoed.json["message"] == "hi"

        # Bad requests are refused and say why.
        five = [{"functionId": echo}] * 5
        problem(await minter.post(TOKENS, {"clientId": "c", "functions": five}), 400, "1 to 4")
        problem(await minter.post(TOKENS, {"clientId": "c", "functions": []}), 400, "1 to 4")
        problem(await minter.post(f"{TOKENS}/{mirror}", {"clientId": "has space"}), 400, "clientId")
        problem(await minter.post(f"{TOKENS}/{mirror}", {"clientId": "x" * 129}), 400, "clientId")
        assert (await minter.post(f"{TOKENS}/{mirror}", {})).status == 400
        problem(await minter.post(f"{TOKENS}/{uuid.uuid4()}", {"clientId": "c"}), 404)
        unknown_version = await minter.post(f"{TOKENS}/{mirror}/versions/{uuid.uuid4()}", {"clientId": "c"})
        problem(unknown_version, 404)
        not_an_id = await minter.post(TOKENS, {"clientId": "c", "functions": [{"functionId": "../x"}]})
        problem(not_an_id, 400, "functionId")
        problem(await p.anonymous.post(f"{TOKENS}/{mirror}", {"clientId": "c"}), 401)
        no_invoke = p.api((await key(p, ["list_functions"]))["value"])
        problem(await no_invoke.post(f"{TOKENS}/{mirror}", {"clientId": "c"}), 403, "invoke_function")

        # Another account's function is not found, for minting as for invoking.
        other = await p.admin.post("/v2/nvcf/accounts/other-account", {"name": "Other", "adminClientId": "other"})
        assert other.status == 200, other.body
        theirs = await p.admin.post("/v2/nvcf/accounts/other-account/functions", ECHO_FUNCTION)
        assert theirs.status == 200, theirs.body
        problem(await minter.post(f"{TOKENS}/{theirs.json['function']['id']}", {"clientId": "c"}), 404)

        # A forged or altered token, and a platform token of another kind, are not let in.
        raw = partner.token
        assert raw is not None
        payload, signature = raw.removeprefix("nvcft_").split(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        claims["fn"].append(f"{echo}/*")
        forged = "nvcft_" + base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=") + "." + signature
        problem(await p.api(forged).post(f"/v2/nvcf/pexec/functions/{echo}", {"message": "m"}), 401, "signature")
        problem(await p.api(altered(raw)).post(f"/v2/nvcf/pexec/functions/{mirror}", {}), 401, "signature")


async def test_a_token_dies_with_its_key(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, MIRROR)
        path = f"/v2/nvcf/pexec/functions/{fid}"

        # Revoked: the token stops at once.
        revoked = await key(p, ["invoke_function"])
        first, _ = await token(p.api(revoked["value"]), f"{TOKENS}/{fid}", {"clientId": "c1"})
        assert (await first.post(path, {})).status == 200
        assert (await p.admin.delete(f"/v1/keys/{revoked['id']}")).status == 204
        problem(await first.post(path, {}), 401, "revoked")

        # Its authorizations changed (narrowed or not): tokens minted before stop.
        changed = await key(p, ["invoke_function"])
        second, _ = await token(p.api(changed["value"]), f"{TOKENS}/{fid}", {"clientId": "c2"})
        assert (await second.post(path, {})).status == 200
        policy = {"product": "nv-cloud-functions", "scopes": ["invoke_function"], "resources": ACCOUNT_FUNCTIONS}
        wider = {"policies": [{**policy, "scopes": ["invoke_function", "list_functions"]}]}
        assert (await p.admin.put(f"/v1/keys/{changed['id']}/authorizations", wider)).status == 200
        problem(await second.post(path, {}), 401, "changed")
        # A token minted after the change works.
        third, _ = await token(p.api(changed["value"]), f"{TOKENS}/{fid}", {"clientId": "c3"})
        assert (await third.post(path, {})).status == 200

        # Never valid past the key's own expiry.
        short = await key(p, ["invoke_function"], expires_in=3)
        brief, ttl = await token(p.api(short["value"]), f"{TOKENS}/{fid}", {"clientId": "c4"})
        assert 0 <= ttl <= 3
        assert (await brief.post(path, {})).status == 200
        await anyio.sleep(ttl + 1.2)
        reply = await brief.post(path, {})
        assert reply.status == 401 and "expired" in reply.json["detail"], reply.body


async def test_admin_credentials_mint_tokens_and_the_plugin_can_be_off(tmp_path: Path) -> None:
    async with platform(tmp_path / "on") as p:
        created = await p.admin.post("/v2/nvcf/functions", MIRROR)
        fid = created.json["function"]["id"]
        # The admin token holds no key: its tokens live their lifetime.
        admin_token, ttl = await token(p.admin, f"{TOKENS}/{fid}", {"clientId": "ops"})
        assert ttl == 3600
        # Not deployed: the token reaches the function, which is not deployed (not a 401 or 403).
        problem(await admin_token.post(f"/v2/nvcf/pexec/functions/{fid}", {}), 404, "not deployed")
    async with platform(tmp_path / "off", **{"plugins.auth_delegation.enabled": False}) as p:
        created = await p.admin.post("/v2/nvcf/functions", MIRROR)
        fid = created.json["function"]["id"]
        problem(await p.admin.post(f"{TOKENS}/{fid}", {"clientId": "ops"}), 503, "auth_delegation")


async def test_any_node_accepts_a_token_and_refuses_it_once_its_key_is_revoked_anywhere(tmp_path: Path) -> None:
    async with two_invocation_nodes(tmp_path) as (p, _, key_b), launching_agent(p, tmp_path / "instances"):
        fid, _ = await deployed(p.admin, MIRROR)
        minted = await key(p, ["invoke_function"])
        on_a, _ = await token(p.api(minted["value"]), f"{TOKENS}/{fid}", {"clientId": "roaming"})
        on_b = key_b.as_(on_a.token)
        reply = await on_b.post(f"/v2/nvcf/pexec/functions/{fid}", {})
        assert reply.status == 200 and reply.json["headers"]["NVCF-SUB"] == "roaming", reply.body

        assert (await p.admin.delete(f"/v1/keys/{minted['id']}")).status == 204  # through node A

        async def refused_on_b() -> bool:
            return (await on_b.post(f"/v2/nvcf/pexec/functions/{fid}", {})).status == 401

        with anyio.fail_after(5):
            while not await refused_on_b():
                await anyio.sleep(0.05)
