"""Plugin spec checks and start ordering."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from nvcf_mono.plugin import PluginSpec
from nvcf_mono.registry import spec_problems, start_order


@attrs.define
class MutableConfig:
    x: int = 1


class AsyncSetup:
    spec: ClassVar[PluginSpec] = PluginSpec(
        name="Bad-Name", description="d", config_type=MutableConfig, requires=("Bad-Name",)
    )

    async def setup(self, ctx: Any) -> None: ...

    def run(self, ctx: Any, task_status: Any) -> None: ...


def test_spec_problems_explain_every_mistake() -> None:
    problems = spec_problems(AsyncSetup, "bad")
    assert problems == [
        "name 'Bad-Name' must be lowercase letters, digits and '_' (it is a config key)",
        "entry point 'bad' names a plugin whose spec.name is 'Bad-Name'",
        "config_type MutableConfig must be frozen (attrs.frozen)",
        "a plugin cannot depend on itself",
        "setup() must be synchronous (it declares; run() does I/O)",
        "run() must be async",
    ]
    assert spec_problems(object) == ["<class 'object'> has no `spec: ClassVar[PluginSpec]`"]


def _spec(name: str, requires: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> PluginSpec:
    return PluginSpec(name=name, description=name, requires=requires, after=after)


def test_start_order_follows_requires_and_after_with_name_ties() -> None:
    specs = {
        s.name: s
        for s in [
            _spec("worker", requires=("api",)),
            _spec("api"),
            _spec("zeta"),
            _spec("alpha", after=("zeta", "missing")),
        ]
    }
    order, issues = start_order(specs)
    assert issues == []
    assert order == ["api", "zeta", "alpha", "worker"]


def test_cycles_are_reported() -> None:
    specs = {s.name: s for s in [_spec("a", requires=("b",)), _spec("b", after=("a",)), _spec("c")]}
    order, issues = start_order(specs)
    assert order == []  # no order to start in: the configuration is refused
    assert [str(i) for i in issues] == ["plugins: dependency cycle among plugins: a, b"]
