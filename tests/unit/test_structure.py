"""The structurer: types, units, checks, and errors that name the path and the source."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

import attrs
import pytest

from nvcf_mono.structure import (
    ByteSize,
    Seconds,
    StructureError,
    Text,
    parse_bytes,
    parse_duration,
    positive,
    setting,
    structure,
    unstructure,
)


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


@attrs.frozen(kw_only=True)
class Inner:
    port: int = setting(8080, doc="port", check=positive)
    host: str = setting("127.0.0.1", doc="host")


@attrs.frozen(kw_only=True)
class Outer:
    name: str = setting(doc="required name")
    inner: Inner = setting(factory=Inner, doc="nested")
    timeout: Seconds = setting(5.0, doc="a duration")
    size: ByteSize = setting(1024, doc="a size")
    mode: Literal["fast", "slow"] = setting("fast", doc="a literal")
    color: Color = setting(Color.RED, doc="an enum")
    tags: tuple[str, ...] = setting((), doc="a list")
    labels: Mapping[str, int] = setting(factory=dict, doc="a mapping")
    path: Path | None = setting(None, doc="optional path")
    secret: str | None = setting(None, doc="a secret", secret=True)

    def __checks__(self) -> Iterator[tuple[str, str]]:
        if self.mode == "slow" and self.timeout < 10:
            yield "timeout", "slow mode needs a timeout of at least 10s"


def test_builds_nested_values_with_defaults() -> None:
    value = structure(Outer, {"name": "x", "inner": {"port": 9000}, "tags": ["a", "b"], "labels": {"k": 1}})
    assert value == Outer(name="x", inner=Inner(port=9000), tags=("a", "b"), labels={"k": 1})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("7", 7.0),
        ("1.5", 1.5),
        ("PT30S", 30.0),
        ("PT1H30M", 5400.0),
        ("P1D", 86400.0),
        ("pt72h", 259200.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert structure(Outer, {"name": "x", "timeout": text}).timeout == seconds


@pytest.mark.parametrize(
    ("text", "size"), [("512", 512), ("64KiB", 65536), ("8MiB", 8 << 20), ("1GB", 10**9), ("2 gib", 2 << 30)]
)
def test_byte_sizes(text: str, size: int) -> None:
    assert parse_bytes(text) == size


def test_text_from_env_is_parsed_by_the_target_type() -> None:
    value = structure(
        Outer,
        {
            "name": Text("123"),
            "inner": {"port": Text("9000")},
            "timeout": Text("1m"),
            "tags": Text("a, b"),
            "color": Text("GREEN"),
            "path": Text("~/x"),
            "secret": Text("null"),
            "labels": Text("{a: 1}"),
        },
    )
    assert value.name == "123"  # a string stays a string, even when it looks like a number
    assert value.inner.port == 9000
    assert value.timeout == 60.0
    assert value.tags == ("a", "b")
    assert value.color is Color.GREEN
    assert value.path == Path("~/x").expanduser()
    assert value.secret is None
    assert value.labels == {"a": 1}
    assert structure(Outer, {"name": "x", "tags": Text("[c, d]")}).tags == ("c", "d")


def test_every_problem_is_reported_with_its_dotted_path_and_source() -> None:
    data = {
        "inner": {"port": "abc", "hots": "x"},
        "timeout": "soon",
        "mode": "medium",
        "color": "blue",
        "size": True,
        "labels": {"k": "v"},
    }
    sources = {("inner", "port"): "env NVCF_MONO__INNER__PORT", ("timeout",): "a.yaml"}
    with pytest.raises(StructureError) as err:
        structure(Outer, data, sources=sources)
    lines = str(err.value).splitlines()
    assert lines == [
        "inner.port: expected an integer, got str 'abc' (from env NVCF_MONO__INNER__PORT)",
        "inner.hots: unknown key (did you mean 'host'?)",
        "timeout: expected a duration such as 500ms, 30s, 5m, 1h or PT30S, got 'soon' (from a.yaml)",
        "mode: expected one of 'fast', 'slow', got str 'medium'",
        "color: expected one of red, green, got str 'blue'",
        "size: expected a size such as 64MiB or a number of bytes, got bool True",
        "labels.k: expected an integer, got str 'v'",
        "name: is required",
    ]


def test_a_yaml_key_written_without_the_space_after_its_colon_is_explained() -> None:
    # `{host:db}` is YAML for the key "host:db" with no value, the common slip in flow style.
    with pytest.raises(StructureError) as err:
        structure(Outer, {"name": "x", "inner": Text("{host:db, port: 5}")})
    assert str(err.value) == (
        "inner.host:db: unknown key (YAML reads it as one key: write 'host: db', with a space after the colon)"
    )


def test_field_checks_and_cross_field_checks() -> None:
    with pytest.raises(StructureError, match=r"inner\.port: must be greater than 0, got -1"):
        structure(Outer, {"name": "x", "inner": {"port": -1}})
    with pytest.raises(StructureError, match="timeout: slow mode needs a timeout of at least 10s"):
        structure(Outer, {"name": "x", "mode": "slow"})


def test_unknown_keys_can_be_ignored_for_lenient_inputs() -> None:
    assert structure(Outer, {"name": "x", "futureField": 1}, forbid_extra=False).name == "x"


def test_bools_and_numbers_are_not_confused() -> None:
    with pytest.raises(StructureError, match="expected an integer, got bool True"):
        structure(Inner, {"port": True})
    with pytest.raises(StructureError, match="expected a string, got int 5"):
        structure(Inner, {"host": 5})


def test_unstructure_round_trips_and_redacts_secrets() -> None:
    value = Outer(name="x", color=Color.GREEN, tags=("a",), path=Path("/p"), secret="hunter2")
    data = unstructure(value)
    assert data["color"] == "green"
    assert data["path"] == "/p"
    assert data["secret"] == "hunter2"
    assert structure(Outer, data) == value
    assert unstructure(value, redact=True)["secret"] == "<redacted>"


@attrs.frozen(kw_only=True)
class Checked:
    names: tuple[str, ...] = setting(
        (), doc="checked item by item", check=lambda v: None if all(len(n) < 5 for n in v) else "too long"
    )
    pairs: Mapping[str, tuple[int, int]] = setting(
        factory=dict, doc="checked as a whole", check=lambda v: None if len(v) < 3 else "too many"
    )
    inner: tuple[Inner, ...] = setting(
        (), doc="nested models", check=lambda v: None if all(i.port for i in v) else "no port"
    )


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"names": [None]}, "names.0"),
        ({"names": ["a", 1]}, "names.1"),
        ({"pairs": {"a": [1, None]}}, "pairs.a.1"),
        ({"pairs": {"a": None}}, "pairs.a"),
        ({"inner": [None, {"port": "x"}]}, "inner.1.port"),
    ],
)
def test_a_failed_item_fails_its_container_before_any_check_sees_it(data: dict[str, object], where: str) -> None:
    # A check (or __checks__) iterating a list must never be handed the structurer's failure sentinel.
    with pytest.raises(StructureError) as info:
        structure(Checked, data)
    assert where in [issue.path for issue in info.value.issues]


def test_durations_and_sizes_too_large_to_be_numbers_are_refused() -> None:
    with pytest.raises(StructureError, match="finite"):
        structure(Outer, {"name": "x", "timeout": "9" * 400})
    with pytest.raises(StructureError, match="finite"):
        structure(Outer, {"name": "x", "size": "9" * 400 + "GiB"})
