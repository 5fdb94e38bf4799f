"""Telemetry endpoints: the API, sealing at rest, the functions that use one, and each account's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nvcf_mono.auth.secret import KEYRING
from nvcf_mono.contracts import buckets
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.control.telemetry import exports_of, function_environment
from nvcf_mono.testing.platform import wait_for
from nvcf_mono.testing.running import ECHO_FUNCTION

from .conftest import platform
from .test_registry_credentials import add_account, control_store

TM = "/v2/nvcf/telemetries"
TOKEN = "otel-TOKEN-0001"
FIELDS = {"telemetryId", "name", "endpoint", "protocol", "provider", "types", "createdAt"}


def telemetry(name: str = "my-collector", types: tuple[str, ...] = ("TRACES", "METRICS"), **extra: Any) -> dict:
    return {
        "endpoint": "https://otel.example.com:4318",
        "protocol": "HTTP",
        "provider": "OTEL_COLLECTOR",
        "types": list(types),
        "secret": {"name": name, "value": TOKEN},
        **extra,
    }


def hidden(body: bytes, *secrets: str) -> None:
    for secret in secrets:
        assert secret.encode() not in body, body
    assert b'"secret"' not in body and b"sealed" not in body


async def test_create_read_list_update_secret_delete(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        made = await p.admin.post(TM, telemetry(types=("traces", "METRICS", "TRACES")))
        assert made.status == 200, made.body
        hidden(made.body, TOKEN)
        tel = made.json["telemetry"]
        assert set(tel) == FIELDS
        assert tel["name"] == "my-collector" and tel["endpoint"] == "https://otel.example.com:4318"
        assert (tel["protocol"], tel["provider"], tel["types"]) == ("HTTP", "OTEL_COLLECTOR", ["TRACES", "METRICS"])
        tid = tel["telemetryId"]
        grafana = await p.admin.post(
            TM,
            {
                **telemetry("grafana", ("LOGS",)),
                "provider": "GRAFANA_CLOUD",
                "endpoint": "https://otlp-gateway.example.net/otlp",
                "secret": {"name": "grafana", "value": {"instanceId": 123456, "apiKey": "glc-KEY-0002"}},
            },
        )
        assert grafana.status == 200, grafana.body
        hidden(grafana.body, "glc-KEY-0002")

        assert (await p.admin.get(f"{TM}/{tid}")).json == made.json
        listed = await p.admin.get(TM)
        assert [t["name"] for t in listed.json["telemetries"]] == ["my-collector", "grafana"]
        hidden(listed.body, TOKEN, "glc-KEY-0002")

        # At rest: sealed.
        entry = await p.bus.kv(buckets.TELEMETRIES.name).get(buckets.account_item_key("nvcf-default", tid))
        assert entry is not None and TOKEN.encode() not in entry.value

        # The secret is replaced under the telemetry's own name only.
        put = f"/v2/nvcf/secrets/telemetries/{tid}"
        renamed = await p.admin.put(put, {"secret": {"name": "other", "value": "x"}})
        assert renamed.status == 400 and "is named 'my-collector'" in renamed.detail
        assert (await p.admin.put(put, {"secret": {"name": "my-collector", "value": ""}})).status == 400
        assert (await p.admin.put(put, {"secret": {"name": "my-collector", "value": "otel-TOKEN-0003"}})).status == 204
        assert (await p.admin.delete(f"{TM}/{tid}")).status == 204
        assert (await p.admin.get(f"{TM}/{tid}")).status == 404
        assert (await p.admin.delete(f"{TM}/{tid}")).status == 404
        assert (await p.admin.put(put, {"secret": {"name": "my-collector", "value": "x"}})).status == 404
        assert await p.bus.kv(buckets.TELEMETRIES.name).get(buckets.account_item_key("nvcf-default", tid)) is None
        # The name is free again.
        assert (await p.admin.post(TM, telemetry())).status == 200


async def test_bad_requests_are_refused_with_what_is_wrong(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        cases: list[tuple[dict[str, Any], str]] = [
            (telemetry(endpoint="otel.example.com:4318"), "must be an http:// or https:// URL with a host"),
            (telemetry(endpoint="ftp://otel.example.com"), "must be an http:// or https:// URL"),
            (telemetry(endpoint="https://u:p@otel.example.com"), "must not carry a query, fragment or user name"),
            (telemetry(endpoint="https://otel.example.com:99999"), "is not a URL"),
            (telemetry(endpoint="http://169.254.169.254/latest"), "169.254.169.254 is a link-local address"),
            (telemetry(endpoint="http://[fe80::1]:4318"), "fe80::1 is a link-local address"),
            (telemetry(endpoint="http://0.0.0.0:4318"), "0.0.0.0 is an unspecified or multicast address"),
            (telemetry(endpoint="http://224.0.0.251:4318"), "is an unspecified or multicast address"),
            (telemetry(endpoint="http://127.0.0.1:4318"), "127.0.0.1 is a loopback address"),
            (telemetry(endpoint="http://[::ffff:127.0.0.1]:4318"), "127.0.0.1 is a loopback address"),
            (telemetry(endpoint="http://[64:ff9b::a00:1]:4318"), "10.0.0.1 is a private or reserved address"),
            (telemetry(endpoint="http://192.168.1.20:4318"), "lists in plugins.control.telemetry_networks"),
            (telemetry(endpoint="http://100.64.0.7:4318"), "100.64.0.7 is a private or reserved address"),
            (telemetry(endpoint="http://localhost:4318"), "localhost resolves to addresses the platform does not"),
            # Legacy forms of 127.0.0.1 are names to a URL parser and loopback to the resolver.
            (telemetry(endpoint="http://2130706433:4318"), "(127.0.0.1 is a loopback address)"),
            (telemetry(endpoint="http://0x7f.1:4318"), "(127.0.0.1 is a loopback address)"),
            (telemetry(provider="DATADOG"), "provider 'DATADOG' is not supported by this platform"),
            (telemetry(provider="NEW_RELIC"), "field=provider"),
            (telemetry(protocol="UDP"), "field=protocol"),
            (telemetry(types=()), "must name at least one of LOGS, METRICS, TRACES"),
            (telemetry(types=("EVENTS",)), "field=types.0"),
            ({**telemetry(), "secret": {"name": "-bad", "value": TOKEN}}, "invalid secret.name '-bad'"),
            ({**telemetry(), "secret": {"name": "t", "value": {"token": TOKEN}}}, "must be a non-empty string"),
            ({**telemetry(), "secret": {"name": "t", "value": "a\r\nX-Evil: 1"}}, "must not contain control"),
            (
                {**telemetry(), "provider": "GRAFANA_CLOUD", "secret": {"name": "g", "value": "key"}},
                'must be a JSON object {"instanceId": ..., "apiKey": ...}',
            ),
            ({k: v for k, v in telemetry().items() if k != "secret"}, "field=secret"),
        ]
        for request, detail in cases:
            reply = await p.admin.post(TM, request)
            assert reply.status == 400, (request, reply.body)
            assert detail in reply.detail, (request, reply.detail)
        assert (await p.admin.get(TM)).json["telemetries"] == []

        assert (await p.admin.post(TM, telemetry())).status == 200
        dup = await p.admin.post(TM, telemetry(types=("LOGS",)))
        assert dup.status == 400 and "with name 'my-collector' already exists" in dup.detail
        for missing in ("00000000-0000-4000-8000-000000000000", "not-a-uuid"):
            assert (await p.admin.get(f"{TM}/{missing}")).status == 404
            assert (await p.admin.delete(f"{TM}/{missing}")).status == 404

        # Scopes: the function key lacks manage_telemetries and update_secrets; no credential is a 401.
        assert (await p.key.get(TM)).status == 403
        assert (await p.key.post(TM, telemetry("other"))).status == 403
        assert (await p.anonymous.get(TM)).status == 401


async def test_limit_per_account_and_isolation(tmp_path: Path) -> None:
    async with platform(tmp_path) as p:
        await add_account(p, "acct-b", maxTelemetriesAllowed=1)
        twin = "/v2/nvcf/accounts/acct-b/telemetries"
        theirs = await p.admin.post(twin, telemetry("b-collector"))
        assert theirs.status == 200, theirs.body
        over = await p.admin.post(twin, telemetry("b-second"))
        assert over.status == 400
        assert "maximum allowed telemetries (1) exceeded. Current count: 1" in over.detail
        other = theirs.json["telemetry"]["telemetryId"]

        # Ours: our own list, the same name again, and nothing of theirs to read, change, delete or use.
        assert (await p.admin.get(TM)).json["telemetries"] == []
        assert (await p.admin.post(TM, telemetry("b-collector"))).status == 200
        assert [t["name"] for t in (await p.admin.get(TM)).json["telemetries"]] == ["b-collector"]
        assert (await p.admin.get(f"{TM}/{other}")).status == 404
        assert (await p.admin.delete(f"{TM}/{other}")).status == 404
        secret = {"secret": {"name": "b-collector", "value": "stolen"}}
        assert (await p.admin.put(f"/v2/nvcf/secrets/telemetries/{other}", secret)).status == 404
        used = await p.admin.post("/v2/nvcf/functions", {**ECHO_FUNCTION, "telemetries": {"tracesTelemetryId": other}})
        assert used.status == 404 and f"Telemetry '{other}': Not found" in used.detail
        assert (await p.admin.get(f"{twin}/{other}")).status == 200

        # Deleting the account takes its telemetries with it.
        assert (await p.admin.delete("/v2/nvcf/accounts/acct-b")).status == 204
        assert await p.bus.kv(buckets.TELEMETRIES.name).get(buckets.account_item_key("acct-b", other)) is None


async def test_functions_choose_endpoints_of_the_right_kind_and_keep_them(tmp_path: Path) -> None:
    async with platform(tmp_path) as p, control_store(p) as store:
        traces = (await p.admin.post(TM, telemetry("traces-only", ("TRACES",)))).json["telemetry"]["telemetryId"]
        logs = (await p.admin.post(TM, telemetry("logs-only", ("LOGS",)))).json["telemetry"]["telemetryId"]

        refused: list[tuple[dict[str, Any], int, str]] = [
            ({}, 400, "Telemetry object must have at least one UUID specified"),
            ({"logsTelemetryId": traces}, 400, "takes TRACES, not LOGS"),
            ({"metricsTelemetryId": logs}, 400, "takes LOGS, not METRICS"),
            ({"tracesTelemetryId": "not-a-uuid"}, 404, "Telemetry 'not-a-uuid': Not found"),
        ]
        for chosen, status, detail in refused:
            reply = await p.admin.post("/v2/nvcf/functions", {**ECHO_FUNCTION, "telemetries": chosen})
            assert reply.status == status, (chosen, reply.body)
            assert detail in reply.detail, (chosen, reply.detail)
        assert (await p.admin.get("/v2/nvcf/functions")).json["functions"] == []

        made = await p.admin.post(
            "/v2/nvcf/functions",
            {**ECHO_FUNCTION, "telemetries": {"tracesTelemetryId": traces, "logsTelemetryId": logs}},
        )
        assert made.status == 200, made.body
        fn = made.json["function"]
        assert fn["telemetries"] == {"tracesTelemetryId": traces, "logsTelemetryId": logs}
        read = await p.admin.get(f"/v2/nvcf/functions/{fn['id']}/versions/{fn['versionId']}")
        assert read.json["function"]["telemetries"] == fn["telemetries"]

        # In use: not deletable, and the refusal names the version.
        busy = await p.admin.delete(f"{TM}/{traces}")
        assert busy.status == 400
        assert f"in use by Function id '{fn['id']}', version '{fn['versionId']}'" in busy.detail

        # What an instance of it gets: the worker's receivers, and the SDK variables for the function.
        keyring = p.host.services.get(KEYRING)

        async def mirrored() -> FunctionVersion | None:
            found = store.functions.get(buckets.version_key(fn["id"], fn["versionId"]))
            return found if found is not None and len(store.telemetries.values()) == 2 else None

        fv = await wait_for(mirrored, what="the store to mirror the function and its telemetries")
        exports = exports_of(store, keyring, fv.nca_id, fv.telemetries, ["10.1.0.0/16"])
        assert exports == {
            "traces": {
                "url": "https://otel.example.com:4318/v1/traces",
                "headers": {"Authorization": f"Bearer {TOKEN}"},
                "name": "traces-only",
                "provider": "OTEL_COLLECTOR",
                "networks": ["10.1.0.0/16"],
            },
            "logs": {
                "url": "https://otel.example.com:4318/v1/logs",
                "headers": {"Authorization": f"Bearer {TOKEN}"},
                "name": "logs-only",
                "provider": "OTEL_COLLECTOR",
                "networks": ["10.1.0.0/16"],
            },
        }
        variables = {e["key"]: e["value"] for e in function_environment(fv, exports)}
        assert variables["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "https://otel.example.com:4318/v1/traces"
        assert variables["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] == f"Authorization=Bearer%20{TOKEN}"
        assert variables["OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"] == "http/protobuf"
        assert variables["OTEL_TRACES_EXPORTER"] == variables["OTEL_LOGS_EXPORTER"] == "otlp"
        assert variables["OTEL_METRICS_EXPORTER"] == "none" and "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT" not in variables
        assert variables["OTEL_SERVICE_NAME"] == "echo"
        assert f"nvcf.function_id={fn['id']}" in variables["OTEL_RESOURCE_ATTRIBUTES"]

        # A new secret is what instances get from then on (at start, and running ones when they ask again).
        put = await p.admin.put(
            f"/v2/nvcf/secrets/telemetries/{traces}", {"secret": {"name": "traces-only", "value": "rotated-0004"}}
        )
        assert put.status == 204, put.body

        async def rotated() -> bool:
            return exports_of(store, keyring, fv.nca_id, fv.telemetries, [])["traces"]["headers"] == {
                "Authorization": "Bearer rotated-0004"
            }

        await wait_for(rotated, what="the rotated secret")

        # Once the version is gone, so is the hold on its telemetries.
        assert (await p.admin.delete(f"/v2/nvcf/functions/{fn['id']}/versions/{fn['versionId']}")).status == 204
        assert (await p.admin.delete(f"{TM}/{traces}")).status == 204
        assert json.loads((await p.admin.get(TM)).body)["telemetries"][0]["telemetryId"] == logs


async def test_the_operator_lists_the_private_networks_endpoints_may_be_in(tmp_path: Path) -> None:
    allowed = '["127.0.0.0/8", "192.168.0.0/16", "0.0.0.0/0"]'
    async with platform(tmp_path, **{"plugins.control.telemetry_networks": allowed}) as p:
        for i, endpoint in enumerate(("http://127.0.0.1:4318", "http://192.168.1.20", "http://localhost:4318")):
            made = await p.admin.post(TM, telemetry(f"listed-{i}", endpoint=endpoint))
            assert made.status == 200, (endpoint, made.body)
        # Listing everything still leaves out what is never a collector (0.0.0.0 reaches this host).
        for endpoint in ("http://0.0.0.0:4318", "http://[::]:4318", "http://239.1.2.3"):
            refused = await p.admin.post(TM, telemetry("never", endpoint=endpoint))
            assert refused.status == 400 and "unspecified or multicast" in refused.detail, (endpoint, refused.body)
