"""Request and reply on one connection, the replies to one wildcard inbox: a future and a loop timer each.

Every invocation is an acknowledged JetStream publish, so this is on the hot path. nats-py's own
``request`` draws random bytes for each reply token, waits through ``asyncio.wait_for`` (a task's
worth of machinery in Python 3.11), and its JetStream ``publish`` parses the acknowledgement with the
standard json module into a dataclass. Here a token is a counter, the deadline a loop timer, the
acknowledgement parsed by orjson: about a quarter less CPU per acknowledged publish in the client
(measured against a local nats-server: 142-148 µs before, 106-112 µs after).

Failures are nats-py's own exceptions, as ``request`` and ``JetStreamContext.publish`` raise them, so
callers translate them the way they did: ``nats.errors.TimeoutError``, ``NoRespondersError`` (a core
request nobody serves), ``nats.js.errors.NoStreamResponseError`` (no stream stores the subject) and
``APIError`` (JetStream refused the message).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any, final

import anyio
import nats.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg as NatsMsg
from nats.js import api
from nats.js import errors as js_errors

_NO_RESPONDERS = "503"
_EXPECTED_STREAM: str = api.Header.EXPECTED_STREAM.value


@final
class Replies:
    """Requests over ``nc`` whose replies come to ``<inbox>.<token>``; subscribes on first use."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._prefix = ""
        self._subscribing = anyio.Lock()
        self._waiting: dict[str, asyncio.Future[NatsMsg]] = {}
        self._tokens = itertools.count()

    @property
    def waiting(self) -> int:
        """Requests waiting for their reply now."""
        return len(self._waiting)

    async def request(
        self, subject: str, data: bytes, *, timeout: float, headers: Mapping[str, str] | None = None
    ) -> NatsMsg:
        """Publish ``data`` with a reply subject and return the reply (raises as described above)."""
        prefix = self._prefix or await self._subscribe()
        token = format(next(self._tokens), "x")
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[NatsMsg] = loop.create_future()
        self._waiting[token] = reply
        timer = loop.call_later(timeout, _expire, reply)
        try:
            await self._nc.publish(subject, data, reply=prefix + token, headers=dict(headers) if headers else None)
            msg = await reply
        finally:
            timer.cancel()
            del self._waiting[token]
        if msg.headers and not msg.data and msg.headers.get(api.Header.STATUS) == _NO_RESPONDERS:
            raise nats.errors.NoRespondersError
        return msg

    async def publish(
        self, subject: str, data: bytes, *, stream: str, timeout: float, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bool]:
        """A JetStream publish to ``stream``, acknowledged once stored: its sequence, and whether it was a
        duplicate (a message id seen within the stream's duplicate window).
        """
        expecting: dict[str, str] = {**headers, _EXPECTED_STREAM: stream} if headers else {_EXPECTED_STREAM: stream}
        try:
            msg = await self.request(subject, data, timeout=timeout, headers=expecting)
        except nats.errors.NoRespondersError as err:
            raise js_errors.NoStreamResponseError from err
        ack = _json(msg.data)
        error = ack.get("error")
        if error is not None:
            raise js_errors.APIError.from_error(error)
        seq = ack.get("seq")
        if not isinstance(seq, int):
            raise js_errors.APIError(description=f"JetStream's acknowledgement has no sequence: {msg.data[:200]!r}")
        return seq, bool(ack.get("duplicate"))

    async def _subscribe(self) -> str:
        async with self._subscribing:
            if not self._prefix:
                prefix = self._nc.new_inbox() + "."
                await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                self._prefix = prefix
        return self._prefix

    async def _on_reply(self, msg: NatsMsg) -> None:
        reply = self._waiting.get(msg.subject[len(self._prefix) :])
        if reply is not None and not reply.done():
            reply.set_result(msg)


def _expire(reply: asyncio.Future[NatsMsg]) -> None:
    if not reply.done():
        reply.set_exception(nats.errors.TimeoutError())


def _json(data: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise js_errors.APIError(description=f"JetStream's answer is not JSON: {data[:200]!r}") from err
    if not isinstance(doc, dict):
        raise js_errors.APIError(description=f"JetStream's answer is not an object: {data[:200]!r}")
    return doc
