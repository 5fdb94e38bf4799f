"""Function secrets: set over HTTP, sealed at rest, never shown, fetched only with a worker token."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nvcf_mono.auth.secret import KEYRING, DecryptError, PlatformSecret
from nvcf_mono.auth.tokens import TokenSigner, mint_worker_token
from nvcf_mono.contracts import buckets, rpc, subjects
from nvcf_mono.contracts.messages import SecretsFetch, SecretsReply
from nvcf_mono.contracts.rpc import RpcError
from nvcf_mono.plugins.auth import SECRET_FILE
from nvcf_mono.testing.platform import Reply

from .conftest import CONTAINER_FUNCTION, Platform, agent, platform
from .test_sharing import account_key, add_account

S = "/v2/nvcf/secrets/functions"
VALUES = ("first-VALUE-0001", "second-VALUE-0002", "third-VALUE-0003", "nested-VALUE-0004", "v2-VALUE-0005")
GPU_SPEC = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 1, "maxInstances": 1}


async def fetch(p: Platform, token: str) -> dict[str, object]:
    reply = await rpc.call(p.bus, subjects.SECRETS_FETCH, SecretsFetch(worker_token=token), SecretsReply, timeout=5)
    return reply.secrets


def worker_token(p: Platform, fid: str, vid: str, signer: TokenSigner | None = None) -> str:
    signer = signer or TokenSigner(p.host.services.get(KEYRING).token_key)
    return mint_worker_token(signer, nca_id="nvcf-default", function_id=fid, function_version_id=vid, request_id="r1")


def no_values(reply: Reply) -> None:
    for value in VALUES:
        assert value.encode() not in reply.body, f"secret value leaked: {reply.body[:300]!r}"


async def test_secrets_are_merged_sealed_and_never_returned(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await p.admin.post(
            "/v2/nvcf/functions", {**CONTAINER_FUNCTION, "secrets": [{"name": "first", "value": VALUES[0]}]}
        )
        assert created.status == 200, created.body
        no_values(created)
        fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
        v2 = await p.admin.post(
            f"/v2/nvcf/functions/{fid}/versions",
            {**CONTAINER_FUNCTION, "secrets": [{"name": "only", "value": VALUES[4]}]},
        )
        vid2 = v2.json["function"]["versionId"]

        put = await p.admin.put(
            f"{S}/{fid}/versions/{vid}",
            {
                "secrets": [
                    {"name": "first", "value": VALUES[1]},  # replaces
                    {"name": "third", "value": VALUES[2]},
                    {"name": "nested", "value": {"k": VALUES[3]}},
                ]
            },
        )
        assert put.status == 204, put.body
        assert put.body == b""

        # Every read the owner and a function key can make: names only in the owner's includeSecrets view,
        # which a version read gives unless asked not to (NVCF's default).
        version = f"/v2/nvcf/functions/{fid}/versions/{vid}"
        detailed = await p.admin.get(version, params={"includeSecrets": "true"})
        assert detailed.json["function"]["secrets"] == ["first", "nested", "third"]
        assert (await p.key.get(version, params={"includeSecrets": "true"})).json["function"]["secrets"] == [
            "first",
            "nested",
            "third",
        ]
        plain = [await p.admin.get(version), await p.key.get(version)]
        for reply in plain:  # a version read names its secrets unless told not to
            assert reply.json["function"]["secrets"] == ["first", "nested", "third"], reply.body
        others = [
            await p.admin.get(version, params={"includeSecrets": "false"}),
            await p.admin.get("/v2/nvcf/functions"),
            await p.key.get("/v2/nvcf/functions"),
            await p.admin.get("/v2/nvcf/functions/ids"),
            await p.admin.get(f"/v2/nvcf/functions/{fid}/versions"),
            await p.key.get(f"/v2/nvcf/functions/{fid}/versions"),
            await p.admin.put(version, {"tags": ["a"]}),
        ]
        for reply in [detailed, *plain, *others]:
            assert reply.status == 200, reply.body
            no_values(reply)
        for reply in others:
            doc = reply.json
            for fn in doc.get("functions", []) + ([doc["function"]] if "function" in doc else []):
                assert "secrets" not in fn, reply.body

        # At rest: the bucket holds names and a sealed blob bound to its key; no plaintext.
        key = buckets.function_secrets_key(fid, vid)
        entry = await p.bus.kv(buckets.SECRETS.name).get(key)
        assert entry is not None
        for value in VALUES:
            assert value.encode() not in entry.value
        stored = buckets.SEALED_SECRETS.decode(entry.value)
        assert stored.names == ("first", "nested", "third")
        platform_secret = PlatformSecret.load(p.host.settings.state_dir / SECRET_FILE)
        opened = json.loads(platform_secret.secret_box().open(stored.sealed, aad=key))
        assert opened == {"first": VALUES[1], "third": VALUES[2], "nested": {"k": VALUES[3]}}
        with pytest.raises(DecryptError):
            PlatformSecret.generate().secret_box().open(stored.sealed, aad=key)
        with pytest.raises(DecryptError):  # bound to its key: not readable as another version's
            platform_secret.secret_box().open(stored.sealed, aad=buckets.function_secrets_key(fid, vid2))

        # Instances fetch them with their worker token: that version's secrets only.
        assert await fetch(p, worker_token(p, fid, vid)) == opened
        assert await fetch(p, worker_token(p, fid, vid2)) == {"only": VALUES[4]}
        forged = worker_token(p, fid, vid, TokenSigner(PlatformSecret.generate().derive("platform-tokens/v1")))
        with pytest.raises(RpcError) as err:
            await fetch(p, forged)
        assert err.value.code == 401
        with pytest.raises(RpcError) as err:
            await fetch(p, "nvcft_garbage")
        assert err.value.code == 401


async def test_first_secrets_only_while_inactive(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, agent(p.bus):
        plain = await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
        fid, vid = plain.json["function"]["id"], plain.json["function"]["versionId"]
        with_secret = await p.admin.post(
            f"/v2/nvcf/functions/{fid}/versions", {**CONTAINER_FUNCTION, "secrets": [{"name": "a", "value": "1"}]}
        )
        vid2 = with_secret.json["function"]["versionId"]
        for v in (vid, vid2):
            deployed = await p.admin.post(
                f"/v2/nvcf/deployments/functions/{fid}/versions/{v}", {"deploymentSpecifications": [GPU_SPEC]}
            )
            assert deployed.status == 200, deployed.body

        refused = await p.admin.put(f"{S}/{fid}/versions/{vid}", {"secrets": [{"name": "a", "value": "1"}]})
        assert refused.status == 400
        # DEPLOYING, or ACTIVE once the scripted agent has started the instance.
        assert re.search(r"has no secrets and is (DEPLOYING|ACTIVE): .*only while it is INACTIVE", refused.detail)
        assert (await p.bus.kv(buckets.SECRETS.name).get(buckets.function_secrets_key(fid, vid))) is None

        # A version that has secrets may change them while deployed.
        changed = await p.admin.put(f"{S}/{fid}/versions/{vid2}", {"secrets": [{"name": "b", "value": "2"}]})
        assert changed.status == 204, changed.body
        assert await fetch(p, worker_token(p, fid, vid2)) == {"a": "1", "b": "2"}
        shown = await p.admin.get(f"/v2/nvcf/functions/{fid}/versions/{vid2}", params={"includeSecrets": "true"})
        assert shown.json["function"]["secrets"] == ["a", "b"]

        # Undeployed (INACTIVE), the first version may get its first secrets.
        assert (await p.admin.delete(f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}")).status == 200
        first = await p.admin.put(f"{S}/{fid}/versions/{vid}", {"secrets": [{"name": "a", "value": "1"}]})
        assert first.status == 204, first.body
        assert await fetch(p, worker_token(p, fid, vid)) == {"a": "1"}


async def test_validation_and_access(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        created = await p.admin.post("/v2/nvcf/functions", CONTAINER_FUNCTION)
        fid, vid = created.json["function"]["id"], created.json["function"]["versionId"]
        path = f"{S}/{fid}/versions/{vid}"
        cases = [
            ({"secrets": []}, "secrets must name at least one secret"),
            ({}, "field=secrets, rejected=null, message=is required"),
            (
                {"secrets": [{"name": "a", "value": "1"}, {"name": "a", "value": "2"}]},
                "duplicate secret name 'a'",
            ),
            ({"secrets": [{"name": "-bad", "value": "1"}]}, "invalid secret name '-bad'"),
            ({"secrets": [{"name": "n" * 49, "value": "1"}]}, "at most 48 characters"),
            ({"secrets": [{"name": "a", "value": 5}]}, "the value must be a string or a JSON object"),
            ({"secrets": [{"name": "a", "value": "x" * 32769}]}, "exceeds 32768 characters"),
            ({"secrets": [{"value": "1"}]}, "field=secrets.0.name"),
        ]
        for body, detail in cases:
            reply = await p.admin.put(path, body)
            assert reply.status == 400, (body, reply.body)
            assert detail in reply.detail, (body, reply.detail)
        many = [{"name": f"s{i}", "value": "x" * 32768} for i in range(17)]
        too_big = await p.admin.put(path, {"secrets": many})
        assert too_big.status == 400 and "would exceed 512 KiB" in too_big.detail
        assert (await p.bus.kv(buckets.SECRETS.name).get(buckets.function_secrets_key(fid, vid))) is None

        unknown = "00000000-0000-4000-8000-000000000000"
        assert (
            await p.admin.put(f"{S}/{unknown}/versions/{vid}", {"secrets": [{"name": "a", "value": "1"}]})
        ).status == 404
        assert (
            await p.admin.put(f"{S}/{fid}/versions/{unknown}", {"secrets": [{"name": "a", "value": "1"}]})
        ).status == 404
        # The function key lacks update_secrets; no credential is a 401.
        assert (await p.key.put(path, {"secrets": [{"name": "a", "value": "1"}]})).status == 403
        assert (await p.anonymous.put(path, {"secrets": [{"name": "a", "value": "1"}]})).status == 401
        # The admin twin acts for the path's account.
        twin = f"/v2/nvcf/accounts/nvcf-default/secrets/functions/{fid}/versions/{vid}"
        assert (await p.admin.put(twin, {"secrets": [{"name": "a", "value": "1"}]})).status == 204
        assert await fetch(p, worker_token(p, fid, vid)) == {"a": "1"}

        # Deleting the version removes its secrets.
        assert (await p.admin.delete(f"/v2/nvcf/functions/{fid}/versions/{vid}")).status == 204
        assert (await p.bus.kv(buckets.SECRETS.name).get(buckets.function_secrets_key(fid, vid))) is None


ACCOUNT = "/v2/nvcf/secrets/account"


async def test_account_secrets_reach_every_version_of_the_account_under_its_own(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        assert (await p.admin.get(ACCOUNT)).json == {"secrets": []}
        put = await p.admin.put(
            ACCOUNT, {"secrets": [{"name": "shared", "value": VALUES[0]}, {"name": "first", "value": "account's"}]}
        )
        assert put.status == 204, put.body
        names = await p.admin.get(ACCOUNT)
        assert names.json == {"secrets": ["first", "shared"]}
        no_values(names)
        merged = await p.admin.put(ACCOUNT, {"secrets": [{"name": "more", "value": {"k": VALUES[1]}}]})
        assert merged.status == 204 and (await p.admin.get(ACCOUNT)).json == {"secrets": ["first", "more", "shared"]}

        own = await p.admin.post(
            "/v2/nvcf/functions", {**CONTAINER_FUNCTION, "secrets": [{"name": "first", "value": VALUES[2]}]}
        )
        bare = await p.admin.post("/v2/nvcf/functions", {**CONTAINER_FUNCTION, "name": "bare"})
        fid, vid = own.json["function"]["id"], own.json["function"]["versionId"]
        fid2, vid2 = bare.json["function"]["id"], bare.json["function"]["versionId"]
        # The version's own secret wins over the account's of the same name; a version without any gets the account's.
        assert await fetch(p, worker_token(p, fid, vid)) == {
            "shared": VALUES[0],
            "first": VALUES[2],
            "more": {"k": VALUES[1]},
        }
        assert await fetch(p, worker_token(p, fid2, vid2)) == {
            "shared": VALUES[0],
            "first": "account's",
            "more": {"k": VALUES[1]},
        }
        assert (await p.admin.get(f"/v2/nvcf/functions/{fid2}/versions/{vid2}")).json["function"].get("secrets") in (
            None,
            [],
        )

        # At rest: sealed, bound to the account's key.
        entry = await p.bus.kv(buckets.SECRETS.name).get(buckets.account_secrets_key("nvcf-default"))
        assert entry is not None and VALUES[0].encode() not in entry.value

        # Another account sees and gets none of them; a super admin manages them for it.
        await add_account(p, "acct-b")
        b = p.api(await account_key(p, "acct-b"))
        assert (await b.get(ACCOUNT)).json == {"secrets": []}
        assert (await b.delete(f"{ACCOUNT}/shared")).status == 404
        assert (
            await p.admin.put("/v2/nvcf/accounts/acct-b/secrets/account", {"secrets": [{"name": "b", "value": "x"}]})
        ).status == 204
        assert (await b.get(ACCOUNT)).json == {"secrets": ["b"]}
        assert (await p.admin.get("/v2/nvcf/accounts/no-such-account/secrets/account")).status == 404

        # Removing one, then the last: the key goes with the last one.
        assert (await p.admin.delete(f"{ACCOUNT}/first")).status == 204
        assert (await p.admin.delete(f"{ACCOUNT}/first")).status == 404
        assert await fetch(p, worker_token(p, fid2, vid2)) == {"shared": VALUES[0], "more": {"k": VALUES[1]}}
        for name in ("shared", "more"):
            assert (await p.admin.delete(f"{ACCOUNT}/{name}")).status == 204
        assert await p.bus.kv(buckets.SECRETS.name).get(buckets.account_secrets_key("nvcf-default")) is None

        # An account deleted takes its secrets along.
        assert (await p.admin.delete("/v2/nvcf/accounts/acct-b")).status == 204
        assert await p.bus.kv(buckets.SECRETS.name).get(buckets.account_secrets_key("acct-b")) is None


async def test_account_secret_requests_are_validated(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        for body, fragment in (
            ({"secrets": []}, "at least one"),
            ({"secrets": [{"name": "bad name", "value": "x"}]}, "name"),
            ({"secrets": [{"name": "a", "value": "x"}, {"name": "a", "value": "y"}]}, "a"),
            ({"secrets": [{"name": "big", "value": "x" * 40000}]}, "32768"),
        ):
            reply = await p.admin.put(ACCOUNT, body)
            assert reply.status == 400 and fragment in reply.detail, (body, reply.body)
        many = [{"name": f"s{i}", "value": "v" * 30000} for i in range(18)]
        assert (await p.admin.put(ACCOUNT, {"secrets": many})).status == 400
        assert (await p.admin.get(ACCOUNT)).json == {"secrets": []}  # nothing of a refused request kept
        assert (await p.admin.delete(f"{ACCOUNT}/a..b")).status == 400
        assert (await p.anonymous.get(ACCOUNT)).status == 401
        # A function key (invoke_function, list_functions) may not touch them.
        assert (await p.key.put(ACCOUNT, {"secrets": [{"name": "a", "value": "x"}]})).status == 403
        assert (await p.key.get(ACCOUNT)).status == 403
