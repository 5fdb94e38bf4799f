"""Typed request/reply on the bus: JSON envelopes with NVCF-like status codes for errors.

A reply is ``{"ok": <payload>}`` or ``{"error": {"code": 404, "message": "..."}}``; callers get the
payload decoded or an :class:`RpcError` with the code, so a 404 (forget this request) and a 503
(try again) are told apart without parsing text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from nvcf_mono import compact_json
from nvcf_mono.bus.api import Bus, Msg
from nvcf_mono.bus.errors import BusError
from nvcf_mono.contracts.messages import MessageError, decode
from nvcf_mono.errors import NvcfMonoError
from nvcf_mono.structure import StructureError, structure_json, unstructure

Resp = TypeVar("Resp")

log = logging.getLogger("nvcf_mono.contracts.rpc")


class RpcError(NvcfMonoError):
    """The responder refused: ``code`` is an HTTP-like status (400, 404, 409, 412, 500, 503)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


async def call(
    bus: Bus, subject: str, request: Any, response_type: type[Resp], *, timeout: float | None = None
) -> Resp:
    """Send ``request`` and decode the reply; raises :class:`RpcError` or the bus's errors."""
    body = compact_json.dumps({"ok": unstructure(request, omit_none=True)})
    reply = await bus.request(subject, body, timeout=timeout)
    return _reply(reply.data, response_type)


def _reply(data: bytes, response_type: type[Resp]) -> Resp:
    try:
        doc = compact_json.loads(data)
    except ValueError as err:
        raise RpcError(502, "the reply is not JSON") from err
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        problem = doc["error"]
        raise RpcError(int(problem.get("code", 500)), str(problem.get("message", "")))
    if not isinstance(doc, dict) or "ok" not in doc:
        raise RpcError(502, "the reply has neither 'ok' nor 'error'")
    try:
        return structure_json(response_type, doc["ok"])
    except StructureError as err:
        raise RpcError(502, f"unexpected reply: {err}") from err


def ok(payload: Any) -> bytes:
    return compact_json.dumps({"ok": unstructure(payload, omit_none=True)})


def error(code: int, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()


Endpoint = tuple[type[Any], Callable[[str, Any], Awaitable[Any]]]


def dispatcher(endpoints: Mapping[str, Endpoint], route: Callable[[str], str]) -> Callable[[Msg], Awaitable[bytes]]:
    """A :meth:`Bus.serve` handler: ``route(subject)`` names the endpoint; errors become envelopes."""

    async def handle(msg: Msg) -> bytes:
        try:
            name = route(msg.subject)
            endpoint = endpoints.get(name)
            if endpoint is None:
                return error(404, f"no such call {name!r}")
            request_type, fn = endpoint
            try:
                doc = compact_json.loads(msg.data) if msg.data else {"ok": {}}
                request = decode(request_type, json.dumps(doc.get("ok", {})).encode())
            except (ValueError, AttributeError, MessageError) as err:
                return error(400, f"bad request: {err}")
            return ok(await fn(msg.subject, request))
        except RpcError as err:
            return error(err.code, err.message)
        except BusError as err:
            return error(503, f"the bus failed while answering: {err}")

    return handle
