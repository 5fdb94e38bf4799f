"""Changing what a client was given, as a client trying its luck would."""

from __future__ import annotations


def altered(text: str) -> str:
    """``text`` (a signature, a token) with its last two characters replaced, so it always differs: a
    base64url HMAC-SHA256 ends in ``AA`` once in 1,024 signatures, which a fixed replacement would keep."""
    return text[:-2] + ("BB" if text.endswith("AA") else "AA")
