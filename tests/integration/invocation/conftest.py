"""Invocation tests use the platform harness of nvcf_mono.testing.running.

Until the compute plane's agent exists, instances come from a scripted agent that takes creation
messages from the bus like a real one and starts ``nvcf-mono worker`` beside the test echo server.
"""

from __future__ import annotations

from nvcf_mono.testing.running import (
    ECHO_FUNCTION,
    Platform,
    deployed,
    launching_agent,
    platform,
    two_invocation_nodes,
)

__all__ = ["ECHO_FUNCTION", "Platform", "deployed", "launching_agent", "platform", "two_invocation_nodes"]
