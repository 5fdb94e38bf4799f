"""Turn plain data (YAML, JSON, env text) into attrs values, with errors that name the dotted path.

A small hand-written structurer (the walker): attrs classes keep a dumb ``__init__`` and this module
does the checking, so one bad config run reports every problem at once, each with where it came from.
Data read from JSON goes through :func:`structure_json`, which builds valid values with code cattrs
generates per class (``structure_fast``) and leaves the rest, and every message, to the walker.
"""

from __future__ import annotations

import difflib
import enum
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import attrs

from nvcf_mono.errors import NvcfMonoError

T = TypeVar("T")

#: Metadata keys used on attrs fields.
DOC = "nvcf_mono.doc"
CHECK = "nvcf_mono.check"
KEY = "nvcf_mono.key"
SECRET = "nvcf_mono.secret"


class Text(str):
    """A value that arrived as text (environment, command line) and is parsed by its target type."""

    __slots__ = ()


@attrs.frozen
class _Duration:
    """Marker: a float number of seconds, also written ``250ms``, ``5s``, ``2m``, ``1h``, ``1d``, ``PT5S``."""


@attrs.frozen
class _ByteSize:
    """Marker: an integer number of bytes, also written ``512KiB``, ``64MiB``, ``1GB``."""


DURATION = _Duration()
BYTESIZE = _ByteSize()
Seconds = typing.Annotated[float, DURATION]
ByteSize = typing.Annotated[int, BYTESIZE]


@attrs.frozen
class Issue:
    """One problem found while structuring: where, what, and which source supplied the value."""

    path: str
    message: str
    source: str | None = None

    def __str__(self) -> str:
        where = self.path or "<top level>"
        suffix = f" (from {self.source})" if self.source else ""
        return f"{where}: {self.message}{suffix}"


class StructureError(NvcfMonoError):
    """Raised with every issue found; ``str()`` gives one line per issue."""

    def __init__(self, issues: Sequence[Issue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


Check = Callable[[Any], "str | None"]


def setting(
    default: Any = attrs.NOTHING,
    *,
    doc: str,
    factory: Callable[[], Any] | None = None,
    check: Check | None = None,
    key: str | None = None,
    secret: bool = False,
) -> Any:
    """Declare an attrs field with its documentation and an optional value check.

    ``check(value)`` returns an error message, or ``None`` when the value is fine. ``key`` is the
    external name when it differs from the attribute (``inferenceUrl`` for ``inference_url``).
    """
    metadata: dict[str, Any] = {DOC: doc}
    if check is not None:
        metadata[CHECK] = check
    if key is not None:
        metadata[KEY] = key
    if secret:
        metadata[SECRET] = True
    if factory is not None:
        return attrs.field(factory=factory, metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


def checked(
    default: Any = attrs.NOTHING,
    *,
    check: Check | None = None,
    factory: Callable[[], Any] | None = None,
    key: str | None = None,
) -> Any:
    """An attrs field of a data model whose value ``structure()`` checks (no documentation needed)."""
    metadata: dict[str, Any] = {}
    if check is not None:
        metadata[CHECK] = check
    if key is not None:
        metadata[KEY] = key
    if factory is not None:
        return attrs.field(factory=factory, metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


# ---- checks ---------------------------------------------------------------------------------------


@attrs.frozen
class Described:
    """A check that also states, as JSON Schema keywords, what it accepts (the OpenAPI document shows them)."""

    check: Check
    schema: Mapping[str, Any]

    def __call__(self, value: Any) -> str | None:
        return self.check(value)


def described(check: Check, **schema: Any) -> Check:
    """``check``, documented by the JSON Schema keywords ``schema`` (``maxLength=256``, ``pattern=...``)."""
    return Described(check, schema)


def check_schema(check: Check | None) -> Mapping[str, Any]:
    """The JSON Schema keywords a check documents ({} when it documents none)."""
    return check.schema if isinstance(check, Described) else {}


def in_range(lo: float, hi: float) -> Check:
    """Check that a number lies in ``[lo, hi]``."""

    def check(value: Any) -> str | None:
        return None if lo <= value <= hi else f"must be between {lo:g} and {hi:g}, got {value!r}"

    return check


def at_least(lo: float) -> Check:
    """Check that a number is ``>= lo``."""

    def check(value: Any) -> str | None:
        return None if value >= lo else f"must be at least {lo:g}, got {value!r}"

    return check


def positive(value: Any) -> str | None:
    """Check that a number is ``> 0``."""
    return None if value > 0 else f"must be greater than 0, got {value!r}"


def matches(pattern: str, what: str) -> Check:
    """Check that a string fully matches ``pattern``; ``what`` names the expected form."""
    rx = re.compile(pattern)

    def check(value: Any) -> str | None:
        return None if rx.fullmatch(value) else f"must be {what}, got {value!r}"

    return check


def optional(check: Check) -> Check:
    """Apply ``check`` unless the value is ``None``."""

    def wrapped(value: Any) -> str | None:
        return None if value is None else check(value)

    return wrapped


# ---- parsing of units -----------------------------------------------------------------------------

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RX = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_ISO_DURATION_RX = re.compile(
    r"(?i)P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)
_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}  # fmt: skip
_BYTES_RX = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_duration(text: str) -> float:
    """Parse ``250ms``, ``5s``, ``2m``, ``1h``, ``1d``, a bare number of seconds, or ISO-8601 ``PT1H30M``."""
    m = _DURATION_RX.fullmatch(text)
    if m:
        return float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]
    iso = _ISO_DURATION_RX.fullmatch(text.strip())
    if iso and any(iso.groupdict().values()):
        parts = {k: float(v) for k, v in iso.groupdict().items() if v}
        return parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
    raise ValueError(f"expected a duration such as 500ms, 30s, 5m, 1h or PT30S, got {text!r}")


def parse_bytes(text: str) -> int:
    """Parse ``512``, ``64KiB``, ``8MiB``, ``1GB`` into a number of bytes."""
    m = _BYTES_RX.fullmatch(text)
    if m and m.group(2).lower() in _BYTE_UNITS:
        size = float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()]
        if not math.isfinite(size):
            raise ValueError(f"expected a finite size, got {text[:64]!r}")
        return int(size)
    raise ValueError(f"expected a size such as 512KiB, 64MiB or 1GB, got {text!r}")


# ---- the structurer -------------------------------------------------------------------------------

Sources = Mapping[tuple[str, ...], str]


@attrs.frozen
class _Cursor:
    path: tuple[str, ...]
    sources: Sources
    issues: list[Issue]
    forbid_extra: bool

    def child(self, key: str) -> _Cursor:
        return _Cursor((*self.path, key), self.sources, self.issues, self.forbid_extra)

    def fail(self, message: str) -> _Invalid:
        source = None
        for i in range(len(self.path), -1, -1):
            source = self.sources.get(self.path[:i])
            if source is not None:
                break
        self.issues.append(Issue(".".join(self.path), message, source))
        return INVALID


class _Invalid:
    """Sentinel for a value that failed; its issue is already recorded."""


INVALID = _Invalid()


def structure(
    tp: type[T] | Any,
    data: Any,
    *,
    path: Sequence[str] = (),
    sources: Sources | None = None,
    forbid_extra: bool = True,
) -> T:
    """Build a ``tp`` from plain ``data``; raise :class:`StructureError` listing every issue."""
    issues: list[Issue] = []
    value = _structure(tp, data, _Cursor(tuple(path), sources or {}, issues, forbid_extra))
    if issues:
        raise StructureError(issues)
    return typing.cast(T, value)


def structure_json(tp: type[T] | Any, data: Any, *, forbid_extra: bool = False) -> T:
    """:func:`structure` for data read from JSON (stored values, bus messages, API bodies).

    Builds it with the functions cattrs generates per class (``structure_fast``), about ten times
    faster; any value they do not build is read by :func:`structure`, which reports its problems.
    """
    from nvcf_mono import structure_fast  # here: cattrs loads where data is read, never in a worker

    try:
        return typing.cast(T, structure_fast.builder(tp, forbid_extra)(data, tp))
    except Exception:
        return typing.cast(T, structure(tp, data, forbid_extra=forbid_extra))


def _describe(value: Any) -> str:
    if isinstance(value, Text):
        return repr(str(value))
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"


def _from_text(value: Text) -> Any:
    """Read env/CLI text the way YAML would read it (``[a, b]``, ``{k: v}``, ``true``)."""
    import yaml  # here: the worker reads its settings without it, and starts faster for it

    try:
        return yaml.safe_load(str(value))
    except yaml.YAMLError:
        return str(value)


def _structure(tp: Any, value: Any, cur: _Cursor) -> Any:
    origin = get_origin(tp)
    if origin is typing.Annotated:
        base, *extras = get_args(tp)
        if DURATION in extras:
            return _duration(value, cur)
        if BYTESIZE in extras:
            return _bytesize(value, cur)
        return _structure(base, value, cur)
    if tp is Any or tp is object:
        return _from_text(value) if isinstance(value, Text) else value
    if origin in (Union, types.UnionType):
        members = get_args(tp)
        is_null = value is None or (isinstance(value, Text) and str(value).lower() in ("null", "none", "~"))
        if is_null and type(None) in members:
            return None
        others = [m for m in members if m is not type(None)]
        if len(others) == 1:
            return _structure(others[0], value, cur)
        for member in others:
            probe = _Cursor(cur.path, cur.sources, [], cur.forbid_extra)
            result = _structure(member, value, probe)
            if not probe.issues:
                return result
        return cur.fail(f"expected one of {', '.join(_type_name(m) for m in others)}, got {_describe(value)}")
    if origin is Literal:
        choices = get_args(tp)
        for choice in choices:
            if value == choice or (isinstance(value, Text) and str(value) == str(choice)):
                return choice
        return cur.fail(f"expected one of {', '.join(repr(c) for c in choices)}, got {_describe(value)}")
    if attrs.has(tp):
        return _attrs(tp, value, cur)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp, value, cur)
    scalar = _SCALARS.get(tp) if isinstance(tp, type) else None
    if scalar is not None:
        return scalar(value, cur)
    if origin in (tuple, list, frozenset, set, Sequence):
        return _sequence(tp, origin, value, cur)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return _mapping(tp, value, cur)
    raise TypeError(f"structure() does not know how to build {tp!r}")


_BOOL_TEXT = {
    "true": True,
    "yes": True,
    "on": True,
    "1": True,
    "false": False,
    "no": False,
    "off": False,
    "0": False,
}


def _bool(value: Any, cur: _Cursor) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, Text) and str(value).strip().lower() in _BOOL_TEXT:
        return _BOOL_TEXT[str(value).strip().lower()]
    return cur.fail(f"expected true or false, got {_describe(value)}")


def _int(value: Any, cur: _Cursor) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, Text):
        try:
            return int(str(value).strip())
        except ValueError:
            pass
    return cur.fail(f"expected an integer, got {_describe(value)}")


def _float(value: Any, cur: _Cursor) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return cur.fail(f"expected a finite number, got {value!r}")
        try:
            return float(value)
        except OverflowError:  # an integer past what a float holds
            return cur.fail("expected a finite number, got an integer too large for one")
    if isinstance(value, Text):
        try:
            return float(str(value).strip())
        except ValueError:
            pass
    return cur.fail(f"expected a number, got {_describe(value)}")


def _str(value: Any, cur: _Cursor) -> Any:
    if isinstance(value, str):
        return str(value)
    return cur.fail(f"expected a string, got {_describe(value)}")


def _path(value: Any, cur: _Cursor) -> Any:
    if isinstance(value, str) and value:
        return Path(str(value)).expanduser()
    return cur.fail(f"expected a path, got {_describe(value)}")


#: Builders of the plain types, by type.
_SCALARS: dict[type, Callable[[Any, _Cursor], Any]] = {bool: _bool, int: _int, float: _float, str: _str, Path: _path}


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return {"str": "a string", "int": "an integer", "float": "a number", "bool": "true/false"}.get(
            tp.__name__, tp.__name__
        )
    return str(tp)


def _with_unit(
    value: Any, cur: _Cursor, *, what: str, example: str, integer: bool, parse: Callable[[str], float]
) -> Any:
    """A number, or text with a unit (``30s``, ``64MiB``); never negative or infinite."""
    if isinstance(value, int | float) and not isinstance(value, bool) and (not integer or isinstance(value, int)):
        if isinstance(value, float) and not math.isfinite(value):
            return cur.fail(f"expected a finite {what}, got {value!r}")
        if not integer and isinstance(value, int) and abs(value) > _LARGEST_FLOAT:
            return cur.fail(f"expected a finite {what}, got an integer too large for one")
        result: float = value
    elif isinstance(value, str):
        try:
            result = parse(str(value))
        except ValueError as err:
            return cur.fail(str(err))
        if not math.isfinite(result):
            return cur.fail(f"expected a finite {what}, got {str(value)[:64]!r}")
    else:
        return cur.fail(f"expected a {what} such as {example}, got {_describe(value)}")
    if result < 0:
        return cur.fail(f"a {what} cannot be negative, got {value!r}")
    return int(result) if integer else float(result)


_LARGEST_FLOAT = int(sys.float_info.max)


def _duration(value: Any, cur: _Cursor) -> Any:
    return _with_unit(
        value,
        cur,
        what="duration",
        example="500ms, 30s, 5m or a number of seconds",
        integer=False,
        parse=parse_duration,
    )


def _bytesize(value: Any, cur: _Cursor) -> Any:
    return _with_unit(value, cur, what="size", example="64MiB or a number of bytes", integer=True, parse=parse_bytes)


def _enum(tp: type[enum.Enum], value: Any, cur: _Cursor) -> Any:
    if isinstance(value, tp):
        return value
    if isinstance(value, str):
        wanted = str(value).strip().lower()
        for member in tp:
            if str(member.value).lower() == wanted or member.name.lower() == wanted:
                return member
    choices = ", ".join(str(m.value) for m in tp)
    return cur.fail(f"expected one of {choices}, got {_describe(value)}")


def _sequence(tp: Any, origin: Any, value: Any, cur: _Cursor) -> Any:
    args = get_args(tp)
    item_tp = args[0] if args else Any
    fixed: tuple[Any, ...] = ()
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item_tp = args[0]
    elif origin is tuple and args and Ellipsis not in args:
        fixed = args  # e.g. tuple[str, str]: a header as a [name, value] pair
    if isinstance(value, Text):
        parsed = _from_text(value)
        value = parsed if isinstance(parsed, list) else [Text(v.strip()) for v in str(value).split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        return cur.fail(f"expected a list, got {_describe(value)}")
    if fixed:
        if len(value) != len(fixed):
            return cur.fail(f"expected {len(fixed)} items, got {len(value)}")
        pairs = enumerate(zip(fixed, value, strict=True))
        members = tuple(_structure(member, item, cur.child(str(i))) for i, (member, item) in pairs)
        return INVALID if any(m is INVALID for m in members) else members
    items = [_structure(item_tp, item, cur.child(str(i))) for i, item in enumerate(value)]
    if any(item is INVALID for item in items):
        # A container with a failed item failed too: checks never see the sentinel.
        return INVALID
    if origin in (frozenset, set):
        return frozenset(items)
    return tuple(items)


def _mapping(tp: Any, value: Any, cur: _Cursor) -> Any:
    args = get_args(tp)
    key_tp, value_tp = args if args else (str, Any)
    if isinstance(value, Text):
        value = _from_text(value)
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        return cur.fail(f"expected a mapping, got {_describe(value)}")
    result: dict[Any, Any] = {}
    failed = False
    for k, v in value.items():
        child = cur.child(str(k))
        key = _structure(key_tp, Text(k) if isinstance(k, str) and key_tp is not str else k, child)
        item = _structure(value_tp, v, child)
        if key is INVALID or item is INVALID:
            failed = True
            continue
        result[key] = item
    return INVALID if failed else result


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of an attrs class (cached)."""
    return typing.get_type_hints(cls, include_extras=True)


def external_key(field: attrs.Attribute[Any]) -> str:
    """The name a field has in external data."""
    return typing.cast(str, field.metadata.get(KEY, field.name))


def _attrs(tp: type, value: Any, cur: _Cursor) -> Any:
    if isinstance(value, tp):
        return value
    if isinstance(value, Text):
        value = _from_text(value)
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        return cur.fail(f"expected a mapping, got {_describe(value)}")
    hints = field_types(tp)
    fields = attrs.fields(tp)
    by_key = {external_key(f): f for f in fields}
    kwargs: dict[str, Any] = {}
    failed = False
    for raw_key, raw in value.items():
        key = str(raw_key)
        field = by_key.get(key)
        if field is None:
            if cur.forbid_extra:
                cur.child(key).fail(f"unknown key{unknown_key_hint(key, raw, list(by_key))}")
                failed = True
            continue
        child = cur.child(key)
        result = _structure(hints[field.name], raw, child)
        if result is INVALID:
            failed = True
            continue
        check = field.metadata.get(CHECK)
        if check is not None:
            problem = check(result)
            if problem:
                child.fail(problem)
                failed = True
                continue
        kwargs[field.name] = result
    for field in fields:
        if field.name not in kwargs and field.default is attrs.NOTHING and external_key(field) not in value:
            cur.child(external_key(field)).fail("is required")
            failed = True
    if failed:
        return INVALID
    instance = tp(**kwargs)
    checker = getattr(instance, "__checks__", None)
    if checker is not None:
        for name, problem in checker():
            cur.child(name).fail(problem)
            failed = True
    return INVALID if failed else instance


# ---- the reverse: plain data for YAML/JSON output -------------------------------------------------


def unstructure(value: Any, *, redact: bool = False, omit_none: bool = False) -> Any:
    """Turn attrs values (and what they hold) into plain data.

    ``redact`` masks secret fields; ``omit_none`` leaves out attrs fields whose value is ``None``
    (the JSON convention of the NVCF API: null fields are omitted). Without ``redact`` the functions
    cattrs generates per class write it (``structure_fast``), with the same result.
    """
    if not redact:
        from nvcf_mono import structure_fast

        return (structure_fast.WITHOUT_NONE if omit_none else structure_fast.PLAIN)(value)
    return _unstructure(value, redact=redact, omit_none=omit_none)


def _unstructure(value: Any, *, redact: bool, omit_none: bool) -> Any:
    if attrs.has(type(value)):
        out: dict[str, Any] = {}
        for field in attrs.fields(type(value)):
            item = getattr(value, field.name)
            if item is None and omit_none:
                continue
            if redact and field.metadata.get(SECRET) and item is not None:
                # Keep the shape (a list stays a list) so the output still reads as config.
                masked = ["<redacted>"] * len(item) if isinstance(item, tuple | list | frozenset) else "<redacted>"
                out[external_key(field)] = masked
            else:
                out[external_key(field)] = _unstructure(item, redact=redact, omit_none=omit_none)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {
            _unstructure(k, redact=False, omit_none=False): _unstructure(v, redact=redact, omit_none=omit_none)
            for k, v in value.items()
        }
    if isinstance(value, frozenset | set):
        return sorted(_unstructure(v, redact=redact, omit_none=omit_none) for v in value)
    if isinstance(value, tuple | list):
        return [_unstructure(v, redact=redact, omit_none=omit_none) for v in value]
    return value


# ---- wire models: camelCase outside, snake_case inside --------------------------------------------


def camel_case(name: str) -> str:
    """``inference_url`` -> ``inferenceUrl`` (a trailing ``_`` is dropped: ``type_`` -> ``type``)."""
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _camel_keys(cls: type, fields: list[attrs.Attribute[Any]]) -> list[attrs.Attribute[Any]]:
    return [f if KEY in f.metadata else f.evolve(metadata={**f.metadata, KEY: camel_case(f.name)}) for f in fields]


class WireModel:
    """Base of :func:`wire` classes, so type checkers know them as attrs classes."""

    if typing.TYPE_CHECKING:
        __attrs_attrs__: typing.ClassVar[Any]


@typing.dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(attrs.field, setting, checked))
def wire(cls: type[T]) -> type[T]:
    """A frozen, keyword-only attrs class whose fields are camelCase in external data (JSON)."""
    return attrs.frozen(kw_only=True, field_transformer=_camel_keys)(cls)


def evolve(inst: T, **changes: Any) -> T:
    """``attrs.evolve`` for any attrs value, :func:`wire` classes included."""
    return attrs.evolve(inst, **changes)  # type: ignore[misc]


def iter_fields(cls: type) -> Iterable[tuple[attrs.Attribute[Any], Any]]:
    """Each attrs field of ``cls`` with its resolved type."""
    hints = field_types(cls)
    for field in attrs.fields(cls):
        yield field, hints[field.name]


def unknown_key_hint(key: str, value: Any, known: Sequence[str]) -> str:
    """`` (did you mean 'x'?)``, `` (known keys: ...)``, or how to write a YAML key that took its value in."""
    name, colon, rest = key.partition(":")
    if colon and value is None and name.strip() in known and rest and not rest[0].isspace():
        # `{name:other}` in YAML is the key "name:other" with no value: a colon needs a space after it.
        return f" (YAML reads it as one key: write '{name.strip()}: {rest}', with a space after the colon)"
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(sorted(known))})"
