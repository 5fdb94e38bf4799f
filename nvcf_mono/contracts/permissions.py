"""What a worker on the nats transport may do on NATS: its version's consumer, cancels and replies.

The reference's worker allow-list (invocation-plane §3.7), narrowed to this platform's subjects:
pull from and acknowledge the version's durable, read the version's cancels, and answer the
invocation nodes (response frames go to ``nvcf.resp.<inbox>.<requestId>``).
"""

from __future__ import annotations

from nvcf_mono.contracts import subjects

#: The kind of platform token a worker session has (ConnectOnce mints it; the auth callout reads it).
WORKER_SESSION = "worker-session"


def worker_publish(stream: str, durable: str) -> tuple[str, ...]:
    """Subjects a worker may publish to."""
    return (
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
        f"{subjects.response_prefix('*')}.>",
    )


def worker_subscribe(function_version_id: str) -> tuple[str, ...]:
    """Subjects a worker may subscribe to."""
    return ("_INBOX.>", subjects.cancel_subject(function_version_id))
