"""Rate limiting of invocations (placeholder: every request is admitted)."""

from __future__ import annotations

from typing import final

from nvcf_mono.auth.principal import Principal
from nvcf_mono.models.function import FunctionVersion


@final
class RateLimiter:
    """Decides whether a request may go ahead; raises ProblemError(429) when it may not."""

    async def admit(self, principal: Principal, fv: FunctionVersion) -> None:
        """Every request is admitted until rate limiting is implemented."""
