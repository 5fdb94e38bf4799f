"""Registry credentials: the API, sealing at rest, and the lookup other planes use."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.contracts import buckets
from nvcf_mono.models.secret import ArtifactType
from nvcf_mono.planes.control.registry import credentials_for
from nvcf_mono.planes.control.store import ControlStore
from nvcf_mono.testing.platform import Reply, wait_for

from .conftest import Platform, platform

RC = "/v2/nvcf/registry-credentials"
NGC_KEY = "nvapi-NGC-PASSWORD-0001"
FIELDS = {
    "registryCredentialId",
    "ncaId",
    "registryCredentialName",
    "registryName",
    "registryHostname",
    "artifactTypes",
    "provisionedBy",
    "createdAt",
    "lastUpdatedAt",
}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def body(host: str, user: str = "robot", password: str = "pa55-WORD-xyz", **extra: Any) -> dict[str, Any]:
    return {
        "registryHostname": host,
        "secret": {"name": f"cred-{host.split('.', maxsplit=1)[0]}", "value": b64(f"{user}:{password}")},
        "artifactTypes": ["CONTAINER"],
        **extra,
    }


async def add_account(p: Platform, nca_id: str, **request: Any) -> None:
    """Create an account through the accounts API."""
    made = await p.admin.post(f"/v2/nvcf/accounts/{nca_id}", {"name": nca_id, **request})
    assert made.status == 200, made.body


def hidden(reply: Reply, *secrets: str) -> None:
    for secret in secrets:
        assert secret.encode() not in reply.body, reply.body
    assert b'"secret"' not in reply.body and b"sealed" not in reply.body


@asynccontextmanager
async def control_store(p: Platform) -> AsyncIterator[ControlStore]:
    """A store mirroring the platform's buckets, as another plane would hold one."""
    store = ControlStore(p.bus, logging.getLogger("tests.store"))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, p.bus)
        yield store
        tg.cancel_scope.cancel()


async def test_add_read_list_update_delete(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        added = await p.admin.post(
            RC,
            body(
                "nvcr.io",
                user="$oauthtoken",
                password=NGC_KEY,
                artifactTypes=["container", "HELM"],
                tags=["team:a"],
                description="NGC pulls",
            ),
        )
        assert added.status == 200, added.body
        hidden(added, NGC_KEY, b64(f"$oauthtoken:{NGC_KEY}"))
        cred = added.json["registryCredential"]
        assert set(cred) == FIELDS | {"tags", "description"}
        assert cred["ncaId"] == "nvcf-default"
        assert cred["registryCredentialName"] == "cred-nvcr"
        assert cred["registryName"] == "NGC" and cred["registryHostname"] == "nvcr.io"
        assert cred["artifactTypes"] == ["CONTAINER", "HELM"]
        assert cred["provisionedBy"] == "USER" and cred["tags"] == ["team:a"] and cred["description"] == "NGC pulls"
        cid = cred["registryCredentialId"]

        names = {
            "docker.io": "Docker Hub",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com": "ECR",
            "public.ecr.aws": "ECR Public",
            "cr.volces.com": "Volcano Engine CR",
            "team-cn-beijing.cr.volces.com": "Volcano Engine CR",
            "myregistry.azurecr.io": "ACR",
            "Registry.Example.com:5000": "registry.example.com:5000",
        }
        for host, name in names.items():
            reply = await p.admin.post(RC, body(host))
            assert reply.status == 200, reply.body
            assert reply.json["registryCredential"]["registryName"] == name
            assert reply.json["registryCredential"]["registryHostname"] == host.lower()
            hidden(reply, "pa55-WORD-xyz")

        one = await p.admin.get(f"{RC}/{cid}")
        assert one.status == 200 and one.json == added.json
        listed = await p.admin.get(RC)
        assert listed.status == 200
        assert [c["registryHostname"] for c in listed.json["registryCredentials"]] == ["nvcr.io"] + [
            h.lower() for h in names
        ]
        hidden(listed, NGC_KEY, "pa55-WORD-xyz")
        helm = await p.admin.get(RC, params={"artifactType": "helm"})
        assert [c["registryCredentialId"] for c in helm.json["registryCredentials"]] == [cid]
        both = await p.admin.get(RC, params={"artifactType": "MODEL,HELM", "provisionedBy": "USER"})
        assert [c["registryCredentialId"] for c in both.json["registryCredentials"]] == [cid]
        assert (await p.admin.get(RC, params={"provisionedBy": "SYSTEM"})).json["registryCredentials"] == []
        bad = await p.admin.get(RC, params={"artifactType": "DISK"})
        assert bad.status == 400 and "expected one of CONTAINER, HELM, MODEL, RESOURCE, got 'DISK'" in bad.detail
        bad = await p.admin.get(RC, params={"provisionedBy": "ME"})
        assert bad.status == 400 and "expected one of USER, SYSTEM" in bad.detail

        # PATCH adds artifact types and replaces the secret.
        patched = await p.admin.patch(
            f"{RC}/{cid}",
            {
                "artifactTypeEnums": ["MODEL", "CONTAINER"],
                "secret": {"name": "ngc-new", "value": b64("$oauthtoken:nvapi-NEW-0002")},
            },
        )
        assert patched.status == 200, patched.body
        hidden(patched, "nvapi-NEW-0002")
        pc = patched.json["registryCredential"]
        assert pc["artifactTypes"] == ["CONTAINER", "HELM", "MODEL"]
        assert pc["registryCredentialName"] == "ngc-new"
        assert pc["createdAt"] == cred["createdAt"] and pc["lastUpdatedAt"] >= cred["lastUpdatedAt"]
        only_types = await p.admin.patch(f"{RC}/{cid}", {"artifactTypeEnums": ["RESOURCE"]})
        assert only_types.json["registryCredential"]["artifactTypes"] == ["CONTAINER", "HELM", "MODEL", "RESOURCE"]

        # At rest: sealed, no plaintext nor its base64.
        entry = await p.bus.kv(buckets.REGISTRY_CREDENTIALS.name).get(buckets.account_item_key("nvcf-default", cid))
        assert entry is not None
        for text in ("nvapi-NEW-0002", b64("$oauthtoken:nvapi-NEW-0002"), NGC_KEY):
            assert text.encode() not in entry.value

        assert (await p.admin.delete(f"{RC}/{cid}")).status == 204
        assert (await p.admin.get(f"{RC}/{cid}")).status == 404
        assert (await p.admin.delete(f"{RC}/{cid}")).status == 404
        assert (await p.admin.patch(f"{RC}/{cid}", {"artifactTypeEnums": ["HELM"]})).status == 404
        assert (
            await p.bus.kv(buckets.REGISTRY_CREDENTIALS.name).get(buckets.account_item_key("nvcf-default", cid)) is None
        )


async def test_validation_errors(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        cases: list[tuple[dict[str, Any], str]] = [
            (
                {**body("registry.example.com"), "secret": {"name": "x", "value": "not base64!"}},
                "secret.value must be base64 of '<username>:<password>'",
            ),
            (
                {**body("registry.example.com"), "secret": {"name": "x", "value": b64("no-colon")}},
                "it does not decode to '<username>:<password>'",
            ),
            (
                {**body("registry.example.com"), "secret": {"name": "x", "value": b64("user:")}},
                "it does not decode to '<username>:<password>'",
            ),
            (
                {**body("nvcr.io"), "secret": {"name": "x", "value": "bnZhcGktb25seQ=="}},  # the bare key
                "base64 of '$oauthtoken:<NGC API key>'",
            ),
            (body("nvcr.io", user="me"), "for NGC (nvcr.io) must use the username '$oauthtoken'"),
            (body("https://nvcr.io"), "must be a host name only"),
            (body("nvcr.io/nvidia"), "must be a host name only"),
            (body("bad_host!"), "is not a valid host name"),
            (body("host.example.com:99999"), "the port must be between 1 and 65535"),
            ({**body("a.example.com"), "secret": {"name": "-x", "value": b64("u:p")}}, "invalid secret.name '-x'"),
            (body("a.example.com", artifactTypes=[]), "field=artifactTypes, rejected=[], message=must name at least"),
            (body("a.example.com", artifactTypes=["DISK"]), "field=artifactTypes.0"),
            (body("a.example.com", tags=["bad tag"]), "field=tags"),
            (body("a.example.com", description="d" * 257), "field=description"),
            ({"registryHostname": "a.example.com", "artifactTypes": ["HELM"]}, "field=secret, rejected=null"),
            ({"secret": {"name": "x", "value": b64("u:p")}, "artifactTypes": ["HELM"]}, "field=registryHostname"),
        ]
        for request, detail in cases:
            reply = await p.admin.post(RC, request)
            assert reply.status == 400, (request, reply.body)
            assert detail in reply.detail, (request, reply.detail)
        assert (await p.admin.get(RC)).json["registryCredentials"] == []

        made = await p.admin.post(RC, body("registry.example.com"))
        cid = made.json["registryCredential"]["registryCredentialId"]
        dup = await p.admin.post(RC, body("REGISTRY.example.com"))
        assert dup.status == 409
        assert f"already exists ({cid}); update it with PATCH {RC}/{cid}" in dup.detail
        empty = await p.admin.patch(f"{RC}/{cid}", {})
        assert empty.status == 400
        assert empty.detail == "At least one of 'secret' or 'artifactTypeEnums' must be specified"
        bad = await p.admin.patch(f"{RC}/{cid}", {"secret": {"name": "x", "value": "%%%"}})
        assert bad.status == 400 and "secret.value must be base64" in bad.detail
        bad = await p.admin.patch(f"{RC}/{cid}", {"artifactTypeEnums": ["NOPE"]})
        assert bad.status == 400 and "field=artifactTypeEnums.0" in bad.detail
        for missing in ("00000000-0000-4000-8000-000000000000", "not-a-uuid"):
            assert (await p.admin.get(f"{RC}/{missing}")).status == 404

        # Scopes: the function key lacks manage_registry_credentials; no credential is a 401.
        assert (await p.key.get(RC)).status == 403
        assert (await p.key.get("/v2/nvcf/recognized-registries")).status == 403
        assert (await p.anonymous.post(RC, body("x.example.com"))).status == 401


async def test_limit_per_account_and_isolation(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        await add_account(p, "acct-b", maxRegistryCredentialsAllowed=2)
        twin = "/v2/nvcf/accounts/acct-b/registry-credentials"
        for host in ("one.example.com", "two.example.com"):
            made = await p.admin.post(twin, body(host))
            assert made.status == 200, made.body
            assert made.json["registryCredential"]["ncaId"] == "acct-b"
        third = await p.admin.post(twin, body("three.example.com"))
        assert third.status == 400
        assert third.detail == "Reached or exceeded the max limit for the number of registry credentials allowed: 2"
        theirs = (await p.admin.get(twin)).json["registryCredentials"]
        assert [c["registryHostname"] for c in theirs] == ["one.example.com", "two.example.com"]
        # Deleting one makes room again.
        assert (await p.admin.delete(f"{twin}/{theirs[1]['registryCredentialId']}")).status == 204
        assert (await p.admin.post(twin, body("three.example.com"))).status == 200

        # Our account: its own list, the same host name again, and no way to reach the other's.
        assert (await p.admin.get(RC)).json["registryCredentials"] == []
        ours = await p.admin.post(RC, body("one.example.com"))
        assert ours.status == 200, ours.body
        assert [c["ncaId"] for c in (await p.admin.get(RC)).json["registryCredentials"]] == ["nvcf-default"]
        other = theirs[0]["registryCredentialId"]
        assert (await p.admin.get(f"{RC}/{other}")).status == 404
        assert (await p.admin.patch(f"{RC}/{other}", {"artifactTypeEnums": ["HELM"]})).status == 404
        assert (await p.admin.delete(f"{RC}/{other}")).status == 404
        assert (await p.admin.get(f"{twin}/{other}")).status == 200
        assert (await p.admin.get("/v2/nvcf/accounts/no-such/registry-credentials")).status == 404


async def test_recognized_registries(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        reply = await p.admin.get("/v2/nvcf/recognized-registries")
        assert reply.status == 200, reply.body
        doc = reply.json["recognizedRegistries"]
        assert set(doc) == {"CONTAINER", "HELM", "MODEL", "RESOURCE"}
        container = {r["hostname"]: r["name"] for r in doc["CONTAINER"]}
        assert container == {
            "docker.io": "Docker Hub",
            "nvcr.io": "NGC",
            "*.amazonaws.com": "ECR",
            "public.ecr.aws": "ECR Public",
            "cr.volces.com": "Volcano Engine CR",
            "*.azurecr.io": "ACR",
        }
        assert doc["MODEL"] == [{"name": "NGC", "hostname": "nvcr.io"}]


async def test_credentials_for(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, control_store(p) as store:
        await add_account(p, "acct-b")
        keyring = p.host.services.get(KEYRING)
        ngc = await p.admin.post(RC, body("nvcr.io", user="$oauthtoken", password=NGC_KEY))
        assert ngc.status == 200, ngc.body
        hub = await p.admin.post(RC, body("docker.io", user="hubuser", password="hub:pass:with:colons"))
        assert hub.status == 200, hub.body

        async def seen() -> bool:
            return len(store.registry_credentials.values()) == 2

        await wait_for(seen, what="the store to mirror both credentials")
        assert credentials_for(store, keyring, "nvcf-default", "nvcr.io", ArtifactType.CONTAINER) == (
            "$oauthtoken",
            NGC_KEY,
        )
        assert credentials_for(store, keyring, "nvcf-default", "NVCR.IO", ArtifactType.CONTAINER) is not None
        # Docker Hub's other names find the docker.io credential; the password keeps its colons.
        assert credentials_for(store, keyring, "nvcf-default", "registry-1.docker.io", ArtifactType.CONTAINER) == (
            "hubuser",
            "hub:pass:with:colons",
        )
        assert credentials_for(store, keyring, "nvcf-default", "nvcr.io", ArtifactType.HELM) is None
        assert credentials_for(store, keyring, "nvcf-default", "ghcr.io", ArtifactType.CONTAINER) is None
        assert credentials_for(store, keyring, "acct-b", "nvcr.io", ArtifactType.CONTAINER) is None

        cid = ngc.json["registryCredential"]["registryCredentialId"]
        await p.admin.patch(
            f"{RC}/{cid}",
            {"artifactTypeEnums": ["HELM"], "secret": {"name": "n", "value": b64("$oauthtoken:nvapi-ROTATED")}},
        )

        async def rotated() -> tuple[str, str] | None:
            found = credentials_for(store, keyring, "nvcf-default", "nvcr.io", ArtifactType.HELM)
            return found if found == ("$oauthtoken", "nvapi-ROTATED") else None

        await wait_for(rotated, what="the rotated NGC credential")
        assert (await p.admin.delete(f"{RC}/{cid}")).status == 204

        async def removed() -> bool:
            return credentials_for(store, keyring, "nvcf-default", "nvcr.io", ArtifactType.CONTAINER) is None

        await wait_for(removed, what="the deleted credential to disappear")
