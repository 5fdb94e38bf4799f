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
