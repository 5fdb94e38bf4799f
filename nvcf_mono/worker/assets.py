"""Input assets of a request, downloaded into its asset directory before the call.

Each asset named by the request (``NVCF-INPUT-ASSET-REFERENCES``) is streamed from the invocation
node's ``FetchAsset`` (which checks that this worker holds the request and that the asset is the
request's account's) into ``<asset dir>/<request id>/<asset id>``, all of them at once. The
inference server finds them through ``NVCF-ASSET-DIR`` and ``NVCF-FUNCTION-ASSET-IDS``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import anyio
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

from nvcf_mono.contracts.frames import Request
from nvcf_mono.proto.gen.nvcf.worker.v1 import AssetChunk, AssetRequest, ConnectResponse

SERVICE = "/nvcf.worker.v1.WorkerService"
#: Longest wait for the next piece of an asset (assets may be large: no deadline for the whole).
IDLE_TIMEOUT = 60.0

log = logging.getLogger("nvcf_mono.worker")


class AssetDownloadError(Exception):
    """An input asset could not be downloaded."""


async def download_assets(channel: Channel, session: ConnectResponse, request: Request, directory: str) -> None:
    """Fetch every input asset of ``request`` into ``directory``; raises :class:`AssetDownloadError`."""
    for asset_id in request.asset_ids:
        # Asset ids become file names: never a path.
        if not asset_id or asset_id in (".", "..") or "/" in asset_id or "\\" in asset_id or "\0" in asset_id:
            raise AssetDownloadError(f"asset id {asset_id!r} is not a valid file name")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise AssetDownloadError(f"cannot create {directory}: {err}") from err
    failures: list[str] = []

    async def one(asset_id: str) -> None:
        try:
            await _download(channel, session, request.request_id, asset_id, Path(directory) / asset_id)
        except AssetDownloadError as err:
            failures.append(str(err))

    async with anyio.create_task_group() as tg:
        for asset_id in dict.fromkeys(request.asset_ids):
            tg.start_soon(one, asset_id)
    if failures:
        raise AssetDownloadError("; ".join(sorted(failures)))


async def _download(channel: Channel, session: ConnectResponse, request_id: str, asset_id: str, target: Path) -> None:
    expected: int | None = None
    written = 0
    try:
        async with (
            channel.request(f"{SERVICE}/FetchAsset", Cardinality.UNARY_STREAM, AssetRequest, AssetChunk) as stream,
            await anyio.open_file(target, "wb") as out,
        ):
            with anyio.fail_after(IDLE_TIMEOUT):
                await stream.send_message(
                    AssetRequest(session_token=session.session_token, request_id=request_id, asset_id=asset_id),
                    end=True,
                )
            while True:
                with anyio.fail_after(IDLE_TIMEOUT):
                    chunk = await stream.recv_message()
                if chunk is None:
                    break
                if expected is None:
                    expected = chunk.size
                if chunk.data:
                    await out.write(chunk.data)
                    written += len(chunk.data)
    except GRPCError as err:
        raise AssetDownloadError(f"asset {asset_id}: {err.status.name}: {err.message}") from err
    except (StreamTerminatedError, OSError, ConnectionError) as err:
        raise AssetDownloadError(f"asset {asset_id}: {type(err).__name__}: {err}") from err
    except TimeoutError as err:
        raise AssetDownloadError(f"asset {asset_id}: nothing arrived for {IDLE_TIMEOUT:g}s") from err
    if expected is None:
        raise AssetDownloadError(f"asset {asset_id}: the node sent nothing")
    if written != expected:
        raise AssetDownloadError(f"asset {asset_id}: {written} bytes arrived of {expected}")
    log.debug("request %s: asset %s downloaded (%d bytes)", request_id, asset_id, written)
