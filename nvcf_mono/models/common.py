"""Small pieces every model uses: ids, timestamps, key/value pairs, field checks with NVCF's texts."""

from __future__ import annotations

import math
import os
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from nvcf_mono.structure import WireModel, checked, described, parse_duration, wire

NAME_PATTERN = r"^[a-z0-9A-Z][a-z0-9A-Z\-_]*$"
_NAME_RX = re.compile(NAME_PATTERN)


def new_id() -> str:
    """A random (version 4) UUID, as every NVCF id except the account's.

    Every invocation draws one; written out directly it costs half of ``str(uuid.uuid4())``.
    """
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # the RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def utc_now() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """``2026-12-02T16:07:07.123Z``: the timestamp format of every response."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_iso() -> str:
    """The current time as :func:`iso` writes it."""
    return iso(utc_now())


def parse_iso(text: str) -> datetime:
    """Read a timestamp written by :func:`iso` (or any ISO-8601 with an offset)."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def is_uuid(text: str) -> bool:
    """True for a canonical UUID string."""
    try:
        return str(uuid.UUID(text)) == text.lower()
    except ValueError:
        return False


# ---- checks (structure() runs them; they return a message or None) --------------------------------

Check = Callable[[Any], "str | None"]


def _name_check(value: str) -> str | None:
    if not 1 <= len(value) <= 128:
        return "size must be between 1 and 128"
    return None if _NAME_RX.match(value) else f'must match "{NAME_PATTERN}"'


#: NVCF's function and task name rule.
name_check = described(_name_check, minLength=1, maxLength=128, pattern=NAME_PATTERN)


def max_len(limit: int) -> Check:
    """A string of at most ``limit`` characters."""

    def check(value: str | None) -> str | None:
        return None if value is None or len(value) <= limit else f"size must be between 0 and {limit}"

    return described(check, maxLength=limit)


def max_items(limit: int) -> Check:
    """A list of at most ``limit`` items."""

    def check(value: tuple[Any, ...] | None) -> str | None:
        return None if value is None or len(value) <= limit else f"size must be between 0 and {limit}"

    return described(check, maxItems=limit)


def int_range(lo: int, hi: int) -> Check:
    """An integer in ``[lo, hi]``."""

    def check(value: int | None) -> str | None:
        if value is None:
            return None
        if value < lo:
            return f"must be greater than or equal to {lo}"
        return None if value <= hi else f"must be less than or equal to {hi}"

    return described(check, minimum=lo, maximum=hi)


_ISO_DURATION_SCHEMA = {"pattern": r"^[Pp]", "maxLength": 64}


def _iso_duration(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.upper().startswith("P") or len(value) > 64:
        return f"must be an ISO-8601 duration such as PT30S, got {value[:64]!r}"
    try:
        seconds = parse_duration(value)
    except ValueError:
        return f"must be an ISO-8601 duration such as PT30S, got {value!r}"
    if not math.isfinite(seconds):
        return f"must be an ISO-8601 duration such as PT30S, got {value[:64]!r}"
    return None


def iso_duration_at_most(limit: str) -> Check:
    """An ISO-8601 duration of at most ``limit`` (itself ISO-8601): a field's sensible range, so a value such
    as ``P999999999D`` is refused rather than overflowing a timer or a date.
    """
    most = parse_duration(limit)

    def check(value: str | None) -> str | None:
        problem = _iso_duration(value)
        if problem is not None or value is None:
            return problem
        return None if parse_duration(value) <= most else f"must be at most {limit}, got {value!r}"

    return described(check, **_ISO_DURATION_SCHEMA)


# A container image reference: [registry[:port]/]path[:tag][@digest], the path in lowercase components
# (the distribution grammar). File paths ('/x', './x', '../x') and URLs are not references.
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE_PATTERN = (
    rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_IMAGE_RX = re.compile(IMAGE_REFERENCE_PATTERN)


def _image_reference(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) <= 1024 and _IMAGE_RX.match(value):
        return None
    return (
        "must be a container image reference such as nvcr.io/org/name:1.0 (lowercase repository path; not a file "
        f"path or URL), got {value[:128]!r}"
    )


#: ``containerImage`` of functions and tasks.
image_reference = described(_image_reference, maxLength=1024, pattern=IMAGE_REFERENCE_PATTERN)

#: A path on the inference server: printable ASCII starting with a single '/'.
URL_PATH_PATTERN = r"^/(?!/)[!-~]*$"
_URL_PATH_RX = re.compile(URL_PATH_PATTERN)


def _url_path(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) > 2048:
        return "size must be between 0 and 2048"
    if not _URL_PATH_RX.match(value) or "\\" in value:
        return f"must be a path starting with '/' in printable ASCII (no spaces, no '\\'), got {value[:128]!r}"
    path = value.split("?", 1)[0].split("#", 1)[0]
    if any(segment in (".", "..") for segment in unquote(path).split("/")):
        # The worker calls this path on the instance: it must not climb out of what the function serves.
        return f"must not contain '.' or '..' segments, got {value[:128]!r}"
    return None


#: ``inferenceUrl`` and health URIs: the path the worker calls on the inference server.
url_path = described(_url_path, maxLength=2048, pattern=URL_PATH_PATTERN)


def duration_seconds(value: str) -> float:
    """Seconds of an ISO-8601 duration (``PT1M30S`` -> 90.0)."""
    return parse_duration(value)


def iso_seconds(seconds: float) -> str:
    """An ISO-8601 duration for a number of seconds (``90`` -> ``PT1M30S``)."""
    total = round(seconds, 3)
    if total <= 0:
        return "PT0S"
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    out = "P" + (f"{int(days)}D" if days else "")
    clock = (f"{int(hours)}H" if hours else "") + (f"{int(minutes)}M" if minutes else "")
    if secs:
        clock += f"{int(secs)}S" if secs == int(secs) else f"{secs:g}S"
    return out + ("T" + clock if clock else "")


# ---- shared small values --------------------------------------------------------------------------


@wire
class KeyValue(WireModel):
    """A ``{key, value}`` pair (``containerEnvironment``)."""

    key: str = checked(check=max_len(4096))
    value: str


@wire
class NameValue(WireModel):
    """A ``{name, value}`` pair (secrets on input; the value is a string or a JSON object)."""

    name: str
    value: Any
