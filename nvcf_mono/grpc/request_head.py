"""grpclib's server handling of one call, with what the request's head says available before it is routed.

grpclib picks a call's handler by its path alone (``mapping.get(path)``) and gives its readers no
access to the request's head. The wrapper installed here keeps the head on the HTTP/2 stream (the
compressed-message reader needs its ``grpc-encoding``), and lets a method table that knows better
choose the handler by the whole head (``for_call(headers)``): the host's table sends a call that
names a function to that function, whatever its path.
"""

from __future__ import annotations

from typing import Any

import grpclib.server

_serve_request = grpclib.server.request_handler


async def _request_handler(mapping: Any, stream: Any, headers: Any, *args: Any) -> None:
    stream.headers = headers
    choose = getattr(mapping, "for_call", None)
    await _serve_request(choose(headers) if choose is not None else mapping, stream, headers, *args)


def install() -> None:
    """Use the wrapper for every grpclib server in this process (idempotent)."""
    grpclib.server.request_handler = _request_handler  # type: ignore[assignment]
