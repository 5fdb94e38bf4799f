"""Sharing functions with other accounts: the authorizations API and what the other account sees."""

from __future__ import annotations

from pathlib import Path

from nvcf_mono.auth import scopes
from nvcf_mono.testing.running import other_account_key

from .conftest import CONTAINER_FUNCTION, Platform, platform

AZ = "/v2/nvcf/authorizations/functions"
OWNER_ONLY = ("inferenceUrl", "inferencePort", "containerImage", "health", "secrets", "activeInstances", "rateLimit")


async def add_account(p: Platform, nca_id: str, *, client_id: str | None = None) -> None:
    """Create an account through the accounts API."""
    request = {"name": nca_id} if client_id is None else {"name": nca_id, "adminClientId": client_id}
    made = await p.admin.post(f"/v2/nvcf/accounts/{nca_id}", request)
    assert made.status == 200, made.body


async def account_key(p: Platform, nca_id: str, scope_names: frozenset[str] = scopes.ACCOUNT_ADMIN_SCOPES) -> str:
    """An API key of ``nca_id`` (made through the API) reaching its own and shared functions."""
    return await other_account_key(p, nca_id, scope_names, create_account=False)


async def new_function(p: Platform, **changes: object) -> tuple[str, str]:
    created = await p.admin.post("/v2/nvcf/functions", {**CONTAINER_FUNCTION, **changes})
    assert created.status == 200, created.body
    fn = created.json["function"]
    return fn["id"], fn["versionId"]


async def new_version(p: Platform, fid: str) -> str:
    created = await p.admin.post(f"/v2/nvcf/functions/{fid}/versions", CONTAINER_FUNCTION)
    assert created.status == 200, created.body
    return str(created.json["function"]["versionId"])


def parties(doc: dict[str, object]) -> list[str]:
    return [p["ncaId"] for p in doc["authorizedParties"]]  # type: ignore[attr-defined, index]


async def test_share_a_function_and_what_the_other_account_sees(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        await add_account(p, "acct-b")
        b = p.api(await account_key(p, "acct-b"))
        fid, vid = await new_function(
            p, secrets=[{"name": "token", "value": "s3cret-value"}], rateLimit={"rateLimit": "100-S"}, tags=["t1"]
        )
        other_fid, other_vid = await new_function(p, name="private-one")
        version = f"/v2/nvcf/functions/{fid}/versions/{vid}"

        # Not shared yet: B cannot see it at all.
        assert (await b.get(version)).status == 404
        listed = await b.get("/v2/nvcf/functions", params={"visibility": "authorized"})
        assert listed.status == 200 and listed.json["functions"] == []

        shared = await p.admin.post(f"{AZ}/{fid}", {"authorizedParties": [{"ncaId": "acct-b"}]})
        assert shared.status == 200, shared.body
        assert shared.json == {
            "function": {"id": fid, "ncaId": "nvcf-default", "authorizedParties": [{"ncaId": "acct-b"}]}
        }

        # B sees what the function is, not how it is built or run.
        seen = await b.get(version, params={"includeSecrets": "true"})
        assert seen.status == 200, seen.body
        fn = seen.json["function"]
        assert fn["ownedByDifferentAccount"] is True
        assert fn["id"] == fid and fn["versionId"] == vid and fn["ncaId"] == "nvcf-default"
        assert fn["name"] == "echo" and fn["tags"] == ["t1"] and fn["status"] == "INACTIVE"
        for field in OWNER_ONLY:
            assert field not in fn, field
        assert b"s3cret-value" not in seen.body and b"token" not in seen.body

        listed = await b.get("/v2/nvcf/functions", params={"visibility": "authorized"})
        assert [f["id"] for f in listed.json["functions"]] == [fid]
        assert all(f["ownedByDifferentAccount"] is True for f in listed.json["functions"])
        assert all(field not in f for f in listed.json["functions"] for field in OWNER_ONLY)
        assert (await b.get("/v2/nvcf/functions", params={"visibility": "private"})).json["functions"] == []
        ids = await b.get("/v2/nvcf/functions/ids")
        assert ids.json["functionIds"] == [fid]
        versions = await b.get(f"/v2/nvcf/functions/{fid}/versions")
        assert [f["versionId"] for f in versions.json["functions"]] == [vid]
        assert versions.json["functions"][0]["ownedByDifferentAccount"] is True

        # The owner's own view is unchanged.
        own = await p.admin.get(version)
        assert "ownedByDifferentAccount" not in own.json["function"]
        assert own.json["function"]["containerImage"] == CONTAINER_FUNCTION["containerImage"]
        assert own.json["function"]["rateLimit"] == {"rateLimit": "100-S"}

        # The unshared function stays invisible.
        assert (await b.get(f"/v2/nvcf/functions/{other_fid}/versions/{other_vid}")).status == 404
        assert (await b.get(f"/v2/nvcf/functions/{other_fid}/versions")).status == 404

        # B may not manage the sharing, change, deploy or delete it: it is not B's function.
        for reply in (
            await b.post(f"{AZ}/{fid}", {"authorizedParties": [{"ncaId": "acct-b"}]}),
            await b.get(f"{AZ}/{fid}"),
            await b.get(f"{AZ}/{fid}/versions/{vid}"),
            await b.patch(f"{AZ}/{fid}/add", {"authorizedParty": {"ncaId": "nvcf-default"}}),
            await b.delete(f"{AZ}/{fid}"),
            await b.post(
                f"/v2/nvcf/deployments/functions/{fid}/versions/{vid}",
                {
                    "deploymentSpecifications": [
                        {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 1, "maxInstances": 1}
                    ]
                },
            ),
            await b.put(version, {"tags": ["mine"]}),
            await b.delete(version),
            await b.put(f"/v2/nvcf/secrets/functions/{fid}/versions/{vid}", {"secrets": [{"name": "x", "value": "y"}]}),
        ):
            assert reply.status == 404, reply.body
        assert (await p.admin.get(version)).status == 200

        # Removing the party takes the access away again.
        removed = await p.admin.patch(f"{AZ}/{fid}/remove", {"authorizedParty": {"ncaId": "acct-b"}})
        assert removed.status == 200, removed.body
        assert removed.json["function"]["authorizedParties"] == []
        assert (await b.get(version)).status == 404
        assert (await b.get("/v2/nvcf/functions", params={"visibility": "authorized"})).json["functions"] == []


async def test_version_level_sharing_reaches_that_version_only(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        await add_account(p, "acct-b")
        await add_account(p, "acct-c")
        b = p.api(await account_key(p, "acct-b"))
        fid, v1 = await new_function(p)
        v2 = await new_version(p, fid)

        made = await p.admin.post(f"{AZ}/{fid}/versions/{v2}", {"authorizedParties": [{"ncaId": "acct-b"}]})
        assert made.status == 200, made.body
        assert made.json == {
            "function": {
                "id": fid,
                "ncaId": "nvcf-default",
                "versionId": v2,
                "authorizedParties": [{"ncaId": "acct-b"}],
            }
        }
        assert (await b.get(f"/v2/nvcf/functions/{fid}/versions/{v2}")).status == 200
        assert (await b.get(f"/v2/nvcf/functions/{fid}/versions/{v1}")).status == 404
        versions = await b.get(f"/v2/nvcf/functions/{fid}/versions")
        assert [f["versionId"] for f in versions.json["functions"]] == [v2]

        # A function-level list too: the function GET shows both; the version GET only its own list.
        await p.admin.post(f"{AZ}/{fid}", {"authorizedParties": [{"ncaId": "acct-c"}]})
        whole = await p.admin.get(f"{AZ}/{fid}")
        assert whole.status == 200
        assert whole.json["functions"] == [
            {"id": fid, "ncaId": "nvcf-default", "authorizedParties": [{"ncaId": "acct-c"}]},
            {"id": fid, "ncaId": "nvcf-default", "versionId": v2, "authorizedParties": [{"ncaId": "acct-b"}]},
        ]
        one = await p.admin.get(f"{AZ}/{fid}/versions/{v2}")
        assert one.json["functions"] == [
            {"id": fid, "ncaId": "nvcf-default", "versionId": v2, "authorizedParties": [{"ncaId": "acct-b"}]}
        ]
        bare = await p.admin.get(f"{AZ}/{fid}/versions/{v1}")
        assert bare.json["functions"] == [
            {"id": fid, "ncaId": "nvcf-default", "versionId": v1, "authorizedParties": []}
        ]

        # A function-level delete keeps the version's own list.
        cleared = await p.admin.delete(f"{AZ}/{fid}")
        assert cleared.status == 200
        assert cleared.json == {"function": {"id": fid, "ncaId": "nvcf-default", "authorizedParties": []}}
        whole = await p.admin.get(f"{AZ}/{fid}")
        assert [parties(f) for f in whole.json["functions"]] == [["acct-b"]]
        assert (await b.get(f"/v2/nvcf/functions/{fid}/versions/{v2}")).status == 200

        cleared = await p.admin.delete(f"{AZ}/{fid}/versions/{v2}")
        assert cleared.status == 200
        assert cleared.json["function"] == {
            "id": fid,
            "ncaId": "nvcf-default",
            "versionId": v2,
            "authorizedParties": [],
        }
        assert (await p.admin.get(f"{AZ}/{fid}")).json["functions"] == []
        assert (await b.get(f"/v2/nvcf/functions/{fid}/versions/{v2}")).status == 404


async def test_add_and_remove(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        for nca in ("acct-b", "acct-c", "acct-d"):
            await add_account(p, nca)
        c = p.api(await account_key(p, "acct-c"))
        fid, vid = await new_function(p)
        v2 = await new_version(p, fid)

        # No list yet: nothing to add to or remove from.
        missing = await p.admin.patch(f"{AZ}/{fid}/add", {"authorizedParty": {"ncaId": "acct-b"}})
        assert missing.status == 404 and "no authorized parties" in missing.detail
        missing = await p.admin.patch(f"{AZ}/{fid}/versions/{vid}/add", {"authorizedParty": {"ncaId": "acct-b"}})
        assert missing.status == 404
        missing = await p.admin.patch(f"{AZ}/{fid}/remove", {"authorizedParty": {"ncaId": "acct-b"}})
        assert missing.status == 404 and "no authorized parties" in missing.detail

        await p.admin.post(f"{AZ}/{fid}", {"authorizedParties": [{"ncaId": "acct-b"}]})
        added = await p.admin.patch(f"{AZ}/{fid}/add", {"authorizedParty": {"ncaId": "acct-c"}})
        assert added.status == 200, added.body
        assert parties(added.json["function"]) == ["acct-b", "acct-c"]
        assert (await c.get(f"/v2/nvcf/functions/{fid}/versions/{v2}")).status == 200

        again = await p.admin.patch(f"{AZ}/{fid}/add", {"authorizedParty": {"ncaId": "acct-c"}})
        assert again.status == 409 and "already shared with 'acct-c'" in again.detail

        # A version inherits the function's list, so it may start its own with an add.
        own = await p.admin.patch(f"{AZ}/{fid}/versions/{v2}/add", {"authorizedParty": {"ncaId": "acct-d"}})
        assert own.status == 200, own.body
        assert own.json["function"]["versionId"] == v2 and parties(own.json["function"]) == ["acct-d"]

        gone = await p.admin.patch(f"{AZ}/{fid}/remove", {"authorizedParty": {"ncaId": "acct-d"}})
        assert gone.status == 404 and "'acct-d' is not an authorized party" in gone.detail
        removed = await p.admin.patch(f"{AZ}/{fid}/remove", {"authorizedParty": {"ncaId": "acct-c"}})
        assert removed.status == 200 and parties(removed.json["function"]) == ["acct-b"]
        assert (await c.get(f"/v2/nvcf/functions/{fid}/versions/{v2}")).status == 404

        # The last party out removes the list: a later add needs a POST first.
        removed = await p.admin.patch(f"{AZ}/{fid}/remove", {"authorizedParty": {"ncaId": "acct-b"}})
        assert removed.status == 200 and removed.json["function"]["authorizedParties"] == []
        assert [f.get("versionId") for f in (await p.admin.get(f"{AZ}/{fid}")).json["functions"]] == [v2]
        assert (await p.admin.patch(f"{AZ}/{fid}/add", {"authorizedParty": {"ncaId": "acct-b"}})).status == 404


async def test_everyone_wildcard(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        await add_account(p, "acct-b")
        b = p.api(await account_key(p, "acct-b"))
        fid, vid = await new_function(p)
        made = await p.admin.post(f"{AZ}/{fid}", {"authorizedParties": [{"ncaId": "*"}]})
        assert made.status == 200, made.body
        assert (await b.get(f"/v2/nvcf/functions/{fid}/versions/{vid}")).json["function"]["ownedByDifferentAccount"]
        full = await p.admin.patch(f"{AZ}/{fid}/add", {"authorizedParty": {"ncaId": "acct-b"}})
        assert full.status == 409 and "every account" in full.detail
        for op in ("add", "remove"):
            wild = await p.admin.patch(f"{AZ}/{fid}/{op}", {"authorizedParty": {"ncaId": "*"}})
            assert wild.status == 400 and "'*'" in wild.detail


async def test_validation_errors(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        await add_account(p, "acct-b", client_id="client-b")
        fid, vid = await new_function(p)
        for path in (f"{AZ}/{fid}", f"{AZ}/{fid}/versions/{vid}"):
            cases = [
                ({"authorizedParties": []}, "must name at least one account; to stop sharing, DELETE"),
                (
                    {"authorizedParties": [{"ncaId": "acct-b"}, {"ncaId": "acct-b"}]},
                    "authorized party 'acct-b' is given more than once",
                ),
                (
                    {"authorizedParties": [{"ncaId": "*"}, {"ncaId": "acct-b"}]},
                    "'*' (every account) must be the only party",
                ),
                ({"authorizedParties": [{"ncaId": "*", "clientId": "client-b"}]}, "clientId must not be given"),
                ({"authorizedParties": [{"ncaId": "nvcf-default"}]}, "owns the function"),
                ({"authorizedParties": [{"ncaId": "no-such-account"}]}, "account 'no-such-account' not found"),
                (
                    {"authorizedParties": [{"ncaId": "acct-b", "clientId": "other"}]},
                    "account 'acct-b' and client 'other' are not set up with each other",
                ),
                ({"authorizedParties": [{"ncaId": "  "}]}, "field=authorizedParties.0.ncaId"),
                ({"authorizedParties": [{"clientId": "x"}]}, "field=authorizedParties.0.ncaId"),
                ({}, "field=authorizedParties, rejected=null, message=is required"),
            ]
            for body, detail in cases:
                reply = await p.admin.post(path, body)
                assert reply.status == 400, (body, reply.body)
                assert detail in reply.detail, (body, reply.detail)
            bad_patch = await p.admin.patch(path + "/add", {"authorizedParty": {}})
            assert bad_patch.status == 400 and "field=authorizedParty.ncaId" in bad_patch.detail
            assert (await p.admin.patch(path + "/add", {"authorizedParty": {"ncaId": "nobody"}})).status == 400
        # clientId matching the account is accepted (deprecated, kept for clients).
        ok = await p.admin.post(f"{AZ}/{fid}", {"authorizedParties": [{"ncaId": "acct-b", "clientId": "client-b"}]})
        assert ok.status == 200, ok.body
        assert ok.json["function"]["authorizedParties"] == [{"ncaId": "acct-b", "clientId": "client-b"}]


async def test_unknown_functions_scopes_and_cross_account(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        await add_account(p, "acct-b")
        fid, vid = await new_function(p)
        unknown = "00000000-0000-4000-8000-000000000000"
        for reply in (
            await p.admin.get(f"{AZ}/{unknown}"),
            await p.admin.post(f"{AZ}/{unknown}", {"authorizedParties": [{"ncaId": "acct-b"}]}),
            await p.admin.get(f"{AZ}/{fid}/versions/{unknown}"),
        ):
            assert reply.status == 404, reply.body
        # The function key lacks authorize_clients.
        assert (await p.key.get(f"{AZ}/{fid}")).status == 403
        assert (await p.anonymous.get(f"{AZ}/{fid}")).status == 401

        # The admin twin acts for the path's account: B has no such function, nvcf-default does.
        twin = "/v2/nvcf/accounts/{}/authorizations/functions/" + fid
        assert (await p.admin.get(twin.format("acct-b"))).status == 404
        made = await p.admin.post(twin.format("nvcf-default"), {"authorizedParties": [{"ncaId": "acct-b"}]})
        assert made.status == 200, made.body
        assert parties((await p.admin.get(f"{AZ}/{fid}")).json["functions"][0]) == ["acct-b"]

        # Deleting the version drops its sharing with it.
        await p.admin.post(f"{AZ}/{fid}/versions/{vid}", {"authorizedParties": [{"ncaId": "acct-b"}]})
        assert (await p.admin.delete(f"/v2/nvcf/functions/{fid}/versions/{vid}")).status == 204
        assert (await p.admin.get(f"{AZ}/{fid}")).status == 404
