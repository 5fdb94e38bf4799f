"""Text from elsewhere (a tenant, a server, an instance's output) made safe to print.

Line breaks would let it start lines that read as the platform's own (a log line with a timestamp
and a level); control characters would reach a terminal as commands (ANSI escapes clear screens,
set titles, move the cursor). Both are shown escaped instead; tabs stay. Text that is lines of
someone else's writing (an instance's log) keeps its line breaks, on a terminal of its own.
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


_IN_LINES = {c: escape for c, escape in _ESCAPES.items() if c != 0x0A}


def on_terminal(text: str) -> str:
    r"""``text`` with its line breaks kept (``\r\n`` as ``\n``) and its other control characters escaped
    (``\x1b``, ``\r``): someone else's lines on a terminal, which no longer obeys them.
    """
    return text.replace("\r\n", "\n").translate(_IN_LINES)
