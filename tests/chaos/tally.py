"""What a chaos scenario counts, per request the caller sent: accepted, answered exactly once, lost, duplicated.

``NVCF_CHAOS_SCALE`` (default 1) multiplies each scenario's load; the figures are printed (``-s``
shows them) so a run at a larger scale can be read off, as the closing notes of the issues report.
"""

from __future__ import annotations

import os
from collections import Counter

import attrs

#: Multiplies every scenario's request counts (CI runs 1; a soak runs 10 or more).
SCALE = max(1, int(os.environ.get("NVCF_CHAOS_SCALE", "1")))


def scaled(n: int) -> int:
    return n * SCALE


@attrs.define
class Tally:
    """Outcomes of one scenario, keyed by the caller's own token for each request."""

    name: str
    sent: int = 0
    accepted: set[str] = attrs.field(factory=set)
    #: token -> how many times the caller got the right answer for it
    answers: Counter[str] = attrs.field(factory=Counter)
    #: token -> answers whose body belonged to another request
    wrong: Counter[str] = attrs.field(factory=Counter)
    #: status -> count of final answers that were errors
    errors: Counter[int] = attrs.field(factory=Counter)
    #: "<status> <detail>" -> count, for the report (why, when a scenario fails)
    error_details: Counter[str] = attrs.field(factory=Counter)

    def answered(self, token: str, *, right: bool) -> None:
        (self.answers if right else self.wrong)[token] += 1

    def failed(self, status: int, detail: str) -> None:
        """A final answer that was an error (counted by status, its detail kept for the report)."""
        self.errors[status] += 1
        self.error_details[f"{status} {detail[:160]}"] += 1

    @property
    def lost(self) -> set[str]:
        return self.accepted - set(self.answers) - set(self.wrong)

    @property
    def duplicated(self) -> set[str]:
        return {t for t, n in self.answers.items() if n > 1}

    def report(self, **extra: object) -> str:
        once = sum(1 for n in self.answers.values() if n == 1)
        fields = {
            "sent": self.sent,
            "accepted": len(self.accepted),
            "answered_once": once,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "wrong_body": sum(self.wrong.values()),
            "errors": dict(self.errors),
            **extra,
            **({"error_details": dict(self.error_details)} if self.error_details else {}),
        }
        line = f"chaos[{self.name}] " + " ".join(f"{k}={v}" for k, v in fields.items())
        print(line)
        return line

    def assert_exactly_once(self) -> None:
        assert not self.wrong, (
            f"{self.name}: wrong answers (another request's body, or an error: {dict(self.error_details)}): "
            f"{dict(self.wrong)}"
        )
        assert not self.lost, f"{self.name}: {len(self.lost)} accepted requests never answered"
        assert not self.duplicated, f"{self.name}: answered more than once: {sorted(self.duplicated)[:5]}"
