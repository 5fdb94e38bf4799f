"""Versioned values in KV: encode, decode, upgrade old versions, refuse newer ones."""

from __future__ import annotations

from typing import Any

import anyio
import attrs
import pytest

from nvcf_mono.bus.api import BucketSpec
from nvcf_mono.bus.codec import SchemaVersionError, TypedKV, VersionedCodec
from nvcf_mono.testing.nats_server import NatsServer
from tests.conftest import connect


@attrs.frozen(kw_only=True)
class FunctionV2:
    name: str
    min_instances: int = 0


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return {"name": data["fn_name"], "min_instances": data.get("min", 0)}


CODEC = VersionedCodec(FunctionV2, 2, "functions", upgrades={1: _v1_to_v2})


def test_round_trip_and_envelope() -> None:
    raw = CODEC.encode(FunctionV2(name="echo", min_instances=1))
    assert raw == b'{"v":2,"data":{"name":"echo","min_instances":1}}'
    assert CODEC.decode(raw) == FunctionV2(name="echo", min_instances=1)


def test_older_values_are_upgraded_and_newer_refused() -> None:
    assert CODEC.decode(b'{"v":1,"data":{"fn_name":"old","min":3}}') == FunctionV2(name="old", min_instances=3)
    with pytest.raises(SchemaVersionError, match="newer than this release reads"):
        CODEC.decode(b'{"v":3,"data":{"name":"x"}}')
    with pytest.raises(SchemaVersionError, match="no schema version envelope"):
        CODEC.decode(b'{"name":"x"}')
    with pytest.raises(SchemaVersionError, match="does not match schema 2"):
        CODEC.decode(b'{"v":2,"data":{"min_instances":1}}')
    # A field added by a newer minor release does not break reading.
    assert CODEC.decode(b'{"v":2,"data":{"name":"x","extra":1}}').name == "x"


async def test_typed_kv_against_nats(nats_server: NatsServer, unique) -> None:  # type: ignore[no-untyped-def]
    async with connect(nats_server.url) as bus:
        store = TypedKV(await bus.ensure_bucket(BucketSpec(name=unique("typed"))), CODEC)
        revision = await store.create("fn.a", FunctionV2(name="a"))
        got = await store.get("fn.a")
        assert got is not None and got.value == FunctionV2(name="a") and got.revision == revision
        await store.kv.put("fn.legacy", b'{"v":1,"data":{"fn_name":"legacy"}}')
        with anyio.fail_after(10):
            async with store.watch("fn.*") as watch:
                assert sorted(v.value.name for v in watch.initial) == ["a", "legacy"]
                await store.update("fn.a", FunctionV2(name="a", min_instances=2), revision=revision)
                await store.delete("fn.legacy")
                changes = []
                async for change in watch:
                    changes.append((change.key, change.value))
                    if len(changes) == 2:
                        break
        assert changes == [("fn.a", FunctionV2(name="a", min_instances=2)), ("fn.legacy", None)]
