"""Control-plane tests use the platform harness of nvcf_mono.testing.running."""

from __future__ import annotations

from nvcf_mono.testing.running import CONTAINER_FUNCTION, Platform, agent, platform

__all__ = ["CONTAINER_FUNCTION", "Platform", "agent", "platform"]
