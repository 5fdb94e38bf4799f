"""h2 formats every frame it receives for a trace log, whether or not anything logs it.

``H2Connection._receive_frame`` calls ``repr(frame)``, and hyperframe's repr of a DATA frame
hex-encodes the whole payload to show its first ten bytes: on a 1 MiB message that is 64 frames of
16 KiB each, and it was 15 % of the CPU of both ends of the worker stream. This keeps the same text
(``<hex:`` the first ten bytes ``...>``) from hex-encoding only what it shows.
"""

from __future__ import annotations

import binascii

import hyperframe.frame

#: Hex digits the repr shows before it elides the rest.
_SHOWN = 20
#: hyperframe's own, kept to check that the text is the same.
original = hyperframe.frame._raw_data_repr


def _raw_data_repr(data: bytes | memoryview | None) -> str:
    if not data:
        return "None"
    r = binascii.hexlify(data[: _SHOWN // 2 + 1]).decode("ascii")
    if len(r) > _SHOWN:
        r = r[:_SHOWN] + "..."
    return "<hex:" + r + ">"


def install() -> None:
    """Replace hyperframe's helper (idempotent)."""
    hyperframe.frame._raw_data_repr = _raw_data_repr
