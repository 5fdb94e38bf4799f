"""The cattrs fast path (``structure_fast``) against the walker in ``structure.py``, on every data model.

Whatever the fast builder accepts, the walker must accept and build the same value (types included);
whatever it writes, the walker must write the same. Each model is fed random data: valid values,
values of the wrong type, text that only the walker parses, missing and unknown keys, values its
checks refuse.
"""

from __future__ import annotations

import enum
import importlib
import json
import math
import pkgutil
import random
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import attrs
import pytest

import nvcf_mono
from nvcf_mono import structure_fast
from nvcf_mono.models.common import KeyValue
from nvcf_mono.models.function import FunctionStatus, FunctionVersion
from nvcf_mono.structure import (
    BYTESIZE,
    CHECK,
    DURATION,
    StructureError,
    Text,
    _unstructure,
    external_key,
    field_types,
    structure,
    structure_json,
    unstructure,
)

CASES = 150


def _models() -> list[type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(nvcf_mono.__path__, "nvcf_mono."):
        if ".testing" in info.name or ".examples" in info.name:
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra (the Helm SDK, OpenTelemetry) not installed
            continue
        for value in vars(module).values():
            if isinstance(value, type) and attrs.has(value) and value.__module__ == module.__name__ and _is_data(value):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


def _is_data(tp: Any, seen: frozenset[type] = frozenset()) -> bool:
    """Whether every field, all the way down, is of a type data is made of (not a lock, a callable...)."""
    origin = get_origin(tp)
    if attrs.has(tp):
        if tp in seen:
            return True
        try:
            hints = field_types(tp)
        except (NameError, TypeError):
            return False  # annotations only a type checker resolves: not a data model
        return all(_is_data(hint, seen | {tp}) for hint in hints.values())
    if origin is typing.Annotated:
        return _is_data(get_args(tp)[0], seen)
    if origin in (Union, types.UnionType, tuple, list, frozenset, set, Sequence, dict, Mapping):
        return all(_is_data(a, seen) for a in get_args(tp) if a is not Ellipsis and a is not type(None))
    if origin is Literal or tp in (Any, object, dict, Mapping):
        return True
    return isinstance(tp, type) and (issubclass(tp, enum.Enum) or tp in (bool, int, float, str, Path))


MODELS = _models()

_WORDS = ["", "a", "x-1", "Active", "ACTIVE", " active ", "true", "no", "5", "-3", "30s", "1.5", "~/p", "null", "a,b"]
#: Strings that pass most of the models' checks (names, paths, image references, ids).
_GOOD_WORDS = ["a", "echo-1", "/echo", "nvcr.io/org/echo:1.0", "0f3c1a52-9a5d-4f62-a7a4-2b1f0c9d8e7a", "H100", "PT30S"]
_GOOD_WORDS += ["image/png", "127.0.0.1:8000", "https://telemetry.example/v1"]


def _junk(rng: random.Random) -> Any:
    junk = [None, True, 0, -1, 2**70, 1.5, -0.5, math.inf, math.nan, "", "s", Text("7"), [], {}, [1], {"k": 1}]
    return rng.choice(junk)


def _pick(rng: random.Random, valid: bool, good: list[Any], bad: list[Any]) -> Any:
    return rng.choice(good if valid else good + bad)


def sample(tp: Any, rng: random.Random, depth: int = 0, *, valid: bool = False) -> Any:
    """A value for ``tp``; unless ``valid``, often one the walker refuses or reads from text."""
    if not valid and rng.random() < 0.08:
        return _junk(rng)
    origin = get_origin(tp)
    if origin is typing.Annotated:
        base, *extras = get_args(tp)
        if DURATION in extras or BYTESIZE in extras:
            return _pick(rng, valid, [0, 5, 2.5, 600], [-1, 10**400, "30s", Text("64MiB"), "bad", math.inf, True])
        return sample(base, rng, depth, valid=valid)
    if tp is Any or tp is object:
        return _pick(rng, valid, [1, "s", [1, "a"], {"a": 1}, None, 2.5], [Text("[1, 2]")])
    if origin in (Union, types.UnionType):
        members = [m for m in get_args(tp) if m is not type(None)]
        if rng.random() < 0.3:
            return _pick(rng, valid, [None], [Text("null"), Text("~")])
        return sample(rng.choice(members), rng, depth, valid=valid)
    if origin is Literal:
        choice = rng.choice(get_args(tp))
        return _pick(rng, valid, [choice], [str(choice), Text(str(choice)), "other"])
    if attrs.has(tp):
        return _attrs_sample(tp, rng, depth + 1, valid=valid) if depth < 4 else None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        member = rng.choice(list(tp))
        return _pick(rng, valid, [member.value, member], [member.name, f" {member.name.lower()} ", "nope"])
    if tp is bool:
        return _pick(rng, valid, [True, False], ["true", Text("yes"), 1, None])
    if tp is int:
        return _pick(rng, valid, [0, 1, 7, 8000], [-2, 2**70, True, 3.0, "5", Text("12"), Text("x")])
    if tp is float:
        return _pick(rng, valid, [0.0, 2.5, 3, 0.5], [-1, math.nan, math.inf, 10**400, True, "1.5", Text("2")])
    if tp is str:
        word = rng.choice(_GOOD_WORDS if valid else _GOOD_WORDS + _WORDS)
        return Text(word) if not valid and rng.random() < 0.3 else word
    if tp is Path:
        return _pick(rng, valid, ["/a/b", "~/x"], ["", 3, Text("/t")])
    if origin in (tuple, list, frozenset, set, Sequence):
        args = get_args(tp)
        if origin is tuple and args and Ellipsis not in args:
            items = [sample(a, rng, depth, valid=valid) for a in args]
            if not valid and rng.random() < 0.1:
                items = items[:-1]
            return items if rng.random() < 0.7 else tuple(items)
        item_tp = args[0] if args else Any
        items = [sample(item_tp, rng, depth, valid=valid) for _ in range(rng.randint(0, 3))]
        return _pick(rng, valid, [items, tuple(items)], ["a,b", Text("x, y"), None])
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        _, value_tp = get_args(tp) or (str, Any)
        keys = ["a", "b", "Key", "x.y"]
        items = {rng.choice(keys): sample(value_tp, rng, depth, valid=valid) for _ in range(rng.randint(0, 3))}
        if not valid and rng.random() < 0.1:
            items[3] = sample(value_tp, rng, depth)  # type: ignore[index]
        return _pick(rng, valid, [items], [None, Text("{a: 1}")])
    raise AssertionError(f"_is_data let through {tp!r}")


def _attrs_sample(cls: type, rng: random.Random, depth: int, *, valid: bool = False) -> Any:
    """Data for ``cls``; when ``valid``, each field's value is one the walker accepts for it, where found."""
    hints = field_types(cls)
    data: dict[Any, Any] = {}
    for field in attrs.fields(cls):
        required = field.default is attrs.NOTHING
        if not required and rng.random() < 0.5:
            continue
        if required and not valid and rng.random() < 0.03:
            continue  # missing
        data[external_key(field)] = _field_sample(field, hints[field.name], rng, depth, valid=valid)
    if not valid and rng.random() < 0.05:
        data["unknownKey"] = 1
    return data


def _field_sample(field: attrs.Attribute[Any], tp: Any, rng: random.Random, depth: int, *, valid: bool) -> Any:
    value = sample(tp, rng, depth, valid=valid)
    for _ in range(12 if valid else 0):
        check = field.metadata.get(CHECK)
        try:
            if not (check and check(structure(tp, value, forbid_extra=True))):
                return value
        except StructureError:
            pass
        value = sample(tp, rng, depth, valid=True)
    return value


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (5 is not 5.0, a list is not a tuple)."""
    if type(a) is not type(b):
        return False
    if attrs.has(type(a)):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in attrs.fields(type(a)))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _walk(tp: Any, data: Any, forbid_extra: bool) -> tuple[str, Any]:
    try:
        return "ok", structure(tp, data, forbid_extra=forbid_extra)
    except StructureError as err:
        return "issues", str(err)
    except Exception as err:  # the walker's own crash is compared too
        return "raised", type(err).__name__


@pytest.mark.parametrize("cls", MODELS, ids=lambda c: f"{c.__module__.removeprefix('nvcf_mono.')}.{c.__qualname__}")
def test_whatever_the_fast_path_builds_the_walker_builds_the_same(cls: type) -> None:
    rng = random.Random(f"{cls.__module__}.{cls.__qualname__}")
    for case in range(CASES):
        data = _attrs_sample(cls, rng, 0, valid=case % 3 == 0)
        forbid_extra = case % 2 == 0
        try:
            fast = structure_fast.builder(cls, forbid_extra)(data, cls)
        except Exception:
            fast = None  # the walker reads it: nothing to compare
        walked = _walk(cls, data, forbid_extra)
        if fast is not None:
            assert walked[0] == "ok", f"fast path built {data!r} where the walker said {walked[1]}"
            assert same(fast, walked[1]), f"{data!r}: fast {fast!r} != walker {walked[1]!r}"
            # and what it writes is what the walker writes
            for omit_none in (False, True):
                ours = unstructure(fast, omit_none=omit_none)
                theirs = _unstructure(fast, redact=False, omit_none=omit_none)
                assert same(ours, theirs), f"{fast!r}: wrote {ours!r}, walker {theirs!r}"
        if not forbid_extra:
            got = _outcome(lambda data=data: structure_json(cls, data))
            assert got[0] == walked[0] and (same(got[1], walked[1]) if got[0] == "ok" else got[1] == walked[1])


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except StructureError as err:
        return "issues", str(err)
    except Exception as err:
        return "raised", type(err).__name__


def test_the_fast_path_builds_the_data_models() -> None:
    """Valid data takes the fast path (else the comparison above would be empty)."""
    fv = FunctionVersion(
        id="a" * 36,
        nca_id="acct",
        version_id="b" * 36,
        name="echo",
        status=FunctionStatus.ACTIVE,
        created_at="2026-01-01T00:00:00Z",
        inference_url="/echo",
        inference_port=8000,
        container_environment=(KeyValue(key="A", value="1"),),
        tags=("a", "b"),
    )
    stored = unstructure(fv)
    assert stored["containerEnvironment"] == [{"key": "A", "value": "1"}]
    assert structure_fast.builder(FunctionVersion, False)(stored, FunctionVersion) == fv
    assert structure_json(FunctionVersion, stored) == fv
    with pytest.raises(structure_fast.GiveUp):
        structure_fast.builder(FunctionVersion, False)({**stored, "inferencePort": "8000"}, FunctionVersion)


def test_bad_data_still_gets_the_walkers_messages() -> None:
    stored = {"id": "f", "ncaId": "a", "versionId": "v", "name": "n", "status": "ACTIVE", "createdAt": "t"}
    with pytest.raises(StructureError) as err:
        structure_json(FunctionVersion, {**stored, "inferencePort": "x", "status": "BOGUS"})
    assert {i.path for i in err.value.issues} == {"inferencePort", "status"}
    assert "expected an integer" in str(err.value)
    with pytest.raises(StructureError, match="unknown key"):
        structure_json(FunctionVersion, {**stored, "inferencPort": 1}, forbid_extra=True)


def test_a_number_too_large_for_a_float_is_an_issue_not_a_crash() -> None:
    @attrs.frozen
    class Limits:
        rate: float
        wait: typing.Annotated[float, DURATION]

    with pytest.raises(StructureError) as err:
        structure_json(Limits, {"rate": 10**400, "wait": 10**400})
    assert [i.path for i in err.value.issues] == ["rate", "wait"]
    assert "too large" in str(err.value)


def test_compact_json_writes_what_orjson_refuses() -> None:
    from nvcf_mono import compact_json

    assert compact_json.dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    # a lone surrogate (undecodable bytes), an integer past 64 bits, a key that is not a string
    for value in ({"h": "\udcff"}, {"n": 2**70}, {1: "x"}):
        assert json.loads(compact_json.dumps(value)) == json.loads(json.dumps(value))
    for value in ({"h": "\udcff"}, {"n": 2**70}):
        assert compact_json.loads(compact_json.dumps(value)) == value  # read back what json wrote
    with pytest.raises(ValueError):
        compact_json.loads(b"{not json")
