"""Input assets of a request, downloaded into its asset directory before the call (placeholder)."""

from __future__ import annotations

from grpclib.client import Channel

from nvcf_mono.contracts.frames import Request
from nvcf_mono.proto.gen.nvcf.worker.v1 import ConnectResponse


async def download_assets(channel: Channel, session: ConnectResponse, request: Request, directory: str) -> None:
    """Fetch every input asset of ``request`` into ``directory`` (not implemented yet)."""
    raise NotImplementedError("input assets are not supported by this worker yet")
