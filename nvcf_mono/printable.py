"""Text from elsewhere (a tenant, a server, an instance's output) made safe to print on one line.

Line breaks would let it start lines that read as the platform's own (a log line with a timestamp
and a level); control characters would reach a terminal as commands (ANSI escapes clear screens,
set titles, move the cursor). Both are shown escaped instead; tabs stay.
"""

from __future__ import annotations

_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))} | {
    0x0A: "\\n",
    0x0D: "\\r",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def one_line(text: str) -> str:
    r"""``text`` with its line breaks and control characters escaped (``\n``, ``\x1b``, ...)."""
    return text.translate(_ESCAPES)
