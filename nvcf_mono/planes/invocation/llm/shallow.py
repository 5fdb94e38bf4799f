"""A JSON object read one level deep: OpenAI request bodies, and the answers the gateway counts usage in.

The gateway reads a few top-level members of a request (``model``, ``stream``, ``prompt_cache_key``,
the token limits) and forwards the rest as it came; of an answer it reads ``usage``. Turning the whole
document into Python objects cost about 24 times its size in memory and held the event loop for
seconds when a body was many small objects (a 64 MiB body of ``{}`` took 1.5 GB), so members stay the
JSON text they came as (:class:`msgspec.Raw`, views of the body) and only small ones are decoded, when
asked for. The whole document is still checked to be JSON, at C speed, without building anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, final

import msgspec

#: A member larger than this is never decoded: the gateway reads only scalars and short strings.
MOST_DECODED = 64 * 1024
_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_VALUE = msgspec.json.Decoder()


class NotJson(ValueError):
    """The body is not a JSON object (the message says why)."""


@final
class ShallowObject(Mapping[str, Any]):
    """The members of a JSON object; a member's value is decoded when it is read.

    A member too large to be one the gateway reads (over :data:`MOST_DECODED`) reads as absent.
    """

    __slots__ = ("_members",)

    def __init__(self, members: dict[str, msgspec.Raw]) -> None:
        self._members = members

    @classmethod
    def parse(cls, raw: bytes | bytearray) -> ShallowObject:
        """The object ``raw`` holds; :class:`NotJson` (saying why, in OpenAI's words) when it holds none."""
        try:
            return cls(_OBJECT.decode(raw))
        except msgspec.ValidationError:
            raise NotJson("The body of your request must be a JSON object.") from None
        except msgspec.DecodeError as err:
            raise NotJson(f"We could not parse the JSON body of your request: {err}") from None
        except RecursionError:
            raise NotJson("We could not parse the JSON body of your request: it is nested too deeply") from None

    def __getitem__(self, key: str) -> Any:
        member = self._members[key]
        if len(member) > MOST_DECODED:
            raise KeyError(key)
        return _VALUE.decode(member)

    def __contains__(self, key: object) -> bool:
        return key in self._members  # however large its value

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def inner(self, key: str) -> ShallowObject | None:
        """A member that is an object, read one level deep in turn (None when absent or not an object)."""
        member = self._members.get(key)
        if member is None:
            return None
        try:
            return ShallowObject(_OBJECT.decode(member))
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return None

    def replace(self, key: str, value: Any) -> None:
        """Set a member (kept in its place when it was there)."""
        self._members[key] = msgspec.Raw(msgspec.json.encode(value))

    def encode(self) -> bytes:
        """The object again: members written as they came, ``replace``'s new values in theirs."""
        return msgspec.json.encode(self._members)


def json_type(value: Any) -> str:
    """How OpenAI's errors name a decoded JSON value's type: ``an integer``, ``an array``, ..."""
    if isinstance(value, bool):  # before int: a bool is an int to Python
        return "a boolean"
    names = {int: "an integer", float: "a number", list: "an array", dict: "an object", str: "a string"}
    return names.get(type(value), "null")
