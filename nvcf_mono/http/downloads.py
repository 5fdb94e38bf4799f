"""A stored object as an HTTP download: streamed with its length, failures told apart from absence."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager

from aiohttp import web

from nvcf_mono.bus.api import ObjectReader
from nvcf_mono.bus.errors import BusError, NotFound
from nvcf_mono.http.problem import ProblemError


async def stream_object(
    request: web.Request,
    opened: AbstractAsyncContextManager[ObjectReader],
    *,
    headers: Mapping[str, str],
    missing: str,
    what: str,
    log: logging.Logger,
) -> web.StreamResponse:
    """Send the object ``opened`` names; 404 ``missing`` when it is not there, 503 when the store fails.

    Once the head is out a failure can only cut the body short: under its ``Content-Length`` the
    client sees it failed.
    """
    response = web.StreamResponse(status=200, headers=headers)
    try:
        async with opened as reader:
            response.content_length = reader.info.size
            await response.prepare(request)
            if request.method == "HEAD":  # its head is the answer: nothing of the object is read
                await response.write_eof()
                return response
            try:
                async for chunk in reader:
                    await response.write(chunk)
            except BusError as err:
                log.warning("download of %s broke off: %s", what, err)
                if request.transport is not None:
                    request.transport.close()
                return response
            except ConnectionError:
                return response  # the client went away
    except NotFound:
        raise ProblemError(404, missing) from None
    except BusError as err:
        raise ProblemError(503, f"{what} cannot be read now: {err}", headers={"Retry-After": "1"}) from err
    await response.write_eof()
    return response
