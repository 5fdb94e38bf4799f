"""Small pieces every model uses: ids, timestamps, key/value pairs, field checks with NVCF's texts."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nvcf_mono.structure import WireModel, checked, parse_duration, wire

NAME_PATTERN = r"^[a-z0-9A-Z][a-z0-9A-Z\-_]*$"
_NAME_RX = re.compile(NAME_PATTERN)


def new_id() -> str:
    """A random UUID, as every NVCF id except the account's."""
    return str(uuid.uuid4())


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


def name_check(value: str) -> str | None:
    """NVCF's function and task name rule."""
    if not 1 <= len(value) <= 128:
        return "size must be between 1 and 128"
    return None if _NAME_RX.match(value) else f'must match "{NAME_PATTERN}"'


def max_len(limit: int) -> Check:
    """A string of at most ``limit`` characters."""

    def check(value: str | None) -> str | None:
        return None if value is None or len(value) <= limit else f"size must be between 0 and {limit}"

    return check


def max_items(limit: int) -> Check:
    """A list of at most ``limit`` items."""

    def check(value: tuple[Any, ...] | None) -> str | None:
        return None if value is None or len(value) <= limit else f"size must be between 0 and {limit}"

    return check


def int_range(lo: int, hi: int) -> Check:
    """An integer in ``[lo, hi]``."""

    def check(value: int | None) -> str | None:
        if value is None:
            return None
        if value < lo:
            return f"must be greater than or equal to {lo}"
        return None if value <= hi else f"must be less than or equal to {hi}"

    return check


def iso_duration(value: str | None) -> str | None:
    """An ISO-8601 duration such as ``PT10S``."""
    if value is None:
        return None
    if not value.upper().startswith("P"):
        return f"must be an ISO-8601 duration such as PT30S, got {value!r}"
    try:
        parse_duration(value)
    except ValueError:
        return f"must be an ISO-8601 duration such as PT30S, got {value!r}"
    return None


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
