"""Which function a gateway model name means: aliases, tags, accounts and versions.

The routing table here is a small stand-in over a dict (the real one mirrors KV buckets; the gateway's
integration test runs it on nats-server). It counts the versions it is asked about, so the test can tell
that a call looks at its own model's functions only.
"""

from __future__ import annotations

from typing import Any, cast

import attrs

from nvcf_mono.auth.principal import Principal
from nvcf_mono.models.function import FunctionStatus, FunctionVersion
from nvcf_mono.planes.invocation.llm.models import ModelCatalog
from nvcf_mono.planes.invocation.routing import RoutingTable


@attrs.define
class Versions:
    by_key: dict[str, FunctionVersion] = attrs.field(factory=dict)
    generation: int = 0

    def values(self) -> list[FunctionVersion]:
        return list(self.by_key.values())

    def put(self, fv: FunctionVersion) -> None:
        self.by_key[f"{fv.id}.{fv.version_id}"] = fv
        self.generation += 1


@attrs.define
class Routing:
    """What the catalog reads of the routing table; versions are shared with account ``shared-with``."""

    functions: Versions = attrs.field(factory=Versions)
    asked: int = 0

    def versions_of(self, function_id: str) -> list[FunctionVersion]:
        return [fv for fv in self.functions.values() if fv.id == function_id]

    def may_invoke(self, principal: Principal, fv: FunctionVersion) -> bool:
        self.asked += 1
        return fv.nca_id == principal.account or principal.account in (fv.description or "").split(",")


def version(fid: str, vid: str, *, owner: str, created: str, tags: tuple[str, ...] = (), shared: str = "") -> Any:
    return FunctionVersion(
        id=fid,
        nca_id=owner,
        version_id=vid,
        name=fid,
        status=FunctionStatus.ACTIVE,
        created_at=created,
        tags=tags,
        description=shared,
    )


def caller(account: str) -> Principal:
    return Principal(kind="jwt", subject="alice", account=account, scopes=frozenset({"invoke_function"}))


def catalog(routing: Routing, models: dict[str, str] | None = None) -> ModelCatalog:
    return ModelCatalog(cast(RoutingTable, routing), models or {})


def test_own_tags_win_over_shared_ones_newer_over_older_and_aliases_over_tags() -> None:
    routing = Routing()
    routing.functions.put(
        version("f-shared", "v1", owner="b", created="2026-01-03T00:00:00Z", tags=("model=m",), shared="a,d")
    )
    routing.functions.put(version("f-own", "v1", owner="a", created="2026-01-01T00:00:00Z", tags=("model=m",)))
    routing.functions.put(version("f-own", "v2", owner="a", created="2026-01-02T00:00:00Z", tags=("model=m",)))
    routing.functions.put(version("f-hidden", "v1", owner="c", created="2026-01-09T00:00:00Z", tags=("model=m",)))
    models = catalog(routing)
    found = models.find(caller("a"), "m")
    assert found is not None and (found[1].id, found[1].version_id) == ("f-own", "v2")
    # The shared function is the best another account may use; an account with none sees nothing.
    shared = models.find(caller("d"), "m")
    assert shared is not None and shared[1].id == "f-shared"
    assert models.find(caller("z"), "m") is None
    # A configured alias wins over the tags, with the function's newest version the caller may use.
    aliased = catalog(routing, {"m": "f-shared/downstream"})
    hit = aliased.find(caller("a"), "m")
    assert hit is not None and hit[1].id == "f-shared" and hit[0].downstream == "downstream"
    assert aliased.find(caller("c"), "m") == models.find(caller("c"), "m")  # the alias is not c's to use
    assert sorted(models.visible(caller("a"))) == ["m"] and models.visible(caller("q")) == {}


def test_a_call_looks_at_its_own_models_functions_only() -> None:
    routing = Routing()
    for i in range(2_000):
        routing.functions.put(
            version(f"f-{i}", "v1", owner="a", created="2026-01-01T00:00:00Z", tags=(f"model=other-{i}",))
        )
    routing.functions.put(version("f-m", "v1", owner="a", created="2026-01-01T00:00:00Z", tags=("model=m",)))
    models = catalog(routing, {"alias": "f-m"})
    models.find(caller("a"), "m")  # builds the tag index once for this generation
    routing.asked = 0
    for _ in range(100):
        assert models.find(caller("a"), "m") is not None
        assert models.find(caller("a"), "alias") is not None
        assert models.find(caller("a"), "missing") is None
    assert routing.asked == 200  # one version each for 'm' and 'alias', none for 'missing'
    # A new version is seen at once: the index follows the table's generation.
    routing.functions.put(version("f-m", "v2", owner="a", created="2026-02-01T00:00:00Z", tags=("model=m",)))
    newest = models.find(caller("a"), "m")
    assert newest is not None and newest[1].version_id == "v2"
