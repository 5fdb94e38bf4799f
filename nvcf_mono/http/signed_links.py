"""Links that carry their own authorization, like S3 pre-signed URLs: an expiry and an HMAC over it.

The HMAC covers a purpose (so a link for one thing never opens another), the subject (an asset and
its operation, a request) and the expiry, keyed from the platform secret: any node can check a link,
and its route needs no bearer token.
"""

from __future__ import annotations

import hmac
import time
from datetime import UTC, datetime

from nvcf_mono.auth.secret import b64u
from nvcf_mono.http.api import Param
from nvcf_mono.http.problem import ProblemError

#: The query parameters of a signed link, as a route documents them.
LINK_PARAMS = (
    Param(name="expires", description="Unix time the link expires.", required=True, schema={"type": "integer"}),
    Param(name="signature", description="The link's signature.", required=True),
)


def signature(key: bytes, purpose: str, subject: str, expires: int) -> str:
    message = f"{purpose}\n{subject}\n{expires}".encode()
    return b64u(hmac.digest(key, message, "sha256"))


def query(key: bytes, purpose: str, subject: str, ttl: float) -> str:
    """``expires=...&signature=...`` for a link valid ``ttl`` seconds from now."""
    expires = int(time.time() + ttl)
    return f"expires={expires}&signature={signature(key, purpose, subject, expires)}"


def check(key: bytes, purpose: str, subject: str, expires: str | None, sig: str | None, *, what: str) -> None:
    """403 unless the link is ours, for this subject, and not expired (check before any lookup)."""
    if not expires or not sig:
        raise ProblemError(403, f"the {what} lacks its 'expires' and 'signature' parameters")
    try:
        when = int(expires)
    except ValueError:
        raise ProblemError(403, f"the {what}'s 'expires' is not a unix time: {expires[:32]!r}") from None
    if not hmac.compare_digest(sig.encode(), signature(key, purpose, subject, when).encode()):
        raise ProblemError(403, f"the {what}'s signature does not match (the link was altered or is not ours)")
    if when < time.time():
        at = datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        raise ProblemError(403, f"the {what} expired at {at}; ask for a new one")
