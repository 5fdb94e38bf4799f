"""What a worker on the nats transport may do on NATS: its version's consumer, cancels and replies.

The reference's worker allow-list (invocation-plane §3.7), narrowed to one session:

- publish: the next-message and info requests of its version's durable and the acks of that
  durable's deliveries (``$JS.API`` and ``$JS.ACK`` of nothing else: no stream, KV or object-store
  API), and response frames (``nvcf.resp.<inbox>.<requestId>.<capability>``; the receiving node
  takes a frame only with the capability that came inside the request, so this right is no use
  for a request the worker was not given), and questions for a gRPC call's live input
  (``nvcf.input.<inbox>.<requestId>.<capability>``, answered only with the same capability);
- subscribe: its own inbox prefix (where its pulls and request replies arrive; every other
  session's and the platform's inboxes stay unreadable) and its version's cancels.

No ``resp`` permission: a worker answers nobody's requests over NATS, so a message it receives
with a reply subject gives it no right to publish there.
"""

from __future__ import annotations

import re

from nvcf_mono.contracts import subjects

#: The kind of platform token a worker session has (ConnectOnce mints it; the auth callout reads it).
WORKER_SESSION = "worker-session"

#: One subject token with no wildcard: what a stream, durable or session id must be to be granted.
_TOKEN = re.compile(r"[^.*>\s]+")


class NotGrantable(ValueError):
    """A name that would widen a grant (a wildcard, or more than one subject token)."""


def _token(name: str, what: str) -> str:
    if not _TOKEN.fullmatch(name):
        raise NotGrantable(f"{what} {name!r} is not a single subject token")
    return name


def worker_publish(stream: str, durable: str) -> tuple[str, ...]:
    """Subjects a worker may publish to."""
    stream, durable = _token(stream, "stream"), _token(durable, "durable")
    return (
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
        subjects.RESPONSE_SUBJECTS,
        subjects.INPUT_SUBJECTS,
    )


_ACK_NUMBERS = re.compile(r"[0-9]+(?:\.[0-9]+){4}")


def is_worker_ack(subject: str, stream: str, durable: str) -> bool:
    """Whether ``subject`` is an ack subject of the durable's deliveries, as :func:`worker_publish` grants.

    A worker on the nats transport names what it pulled by that subject, and its node naks it there
    when the worker's session ends: the node publishes for it, so only these subjects are taken.
    """
    prefix = f"$JS.ACK.{stream}.{durable}."
    return subject.startswith(prefix) and _ACK_NUMBERS.fullmatch(subject[len(prefix) :]) is not None


def worker_subscribe(function_version_id: str, inbox_prefix: str) -> tuple[str, ...]:
    """Subjects a worker may subscribe to: its session's inbox prefix and its version's cancels."""
    root, _, session = inbox_prefix.partition(".")
    if root != subjects.WORKER_INBOX_ROOT:
        raise NotGrantable(f"inbox prefix {inbox_prefix!r} is not under {subjects.WORKER_INBOX_ROOT}")
    _token(session, "inbox session")
    return (f"{inbox_prefix}.>", subjects.cancel_subject(_token(function_version_id, "function version")))
