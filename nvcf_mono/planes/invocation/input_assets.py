"""Input assets named by an invocation (``NVCF-INPUT-ASSET-REFERENCES``, exec's ``inputAssetReferences``).

The ids are checked against a watch-fed copy of ``nvcf_assets``: each must be an asset of the
caller's account whose content was uploaded. Only a miss asks the bucket itself (the copy may lag
an upload by a moment), so a request naming existing assets costs no KV read. The worker
downloads them; the request carries only their ids.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import final

import anyio
from anyio.abc import TaskStatus

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import BusError
from nvcf_mono.bus.mirror import KvMirror
from nvcf_mono.contracts import buckets
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.asset import Asset

ASSET_REFERENCES = "NVCF-INPUT-ASSET-REFERENCES"
#: More ids than this in one request is a mistake, not a use.
MAX_ASSETS = 128


def parse_references(values: Iterable[str], *, source: str = ASSET_REFERENCES) -> tuple[str, ...]:
    """Comma-separated, repeatable, trimmed asset ids (canonical UUIDs, duplicates dropped); 400 otherwise."""
    found: dict[str, None] = {}
    for value in values:
        for part in value.split(","):
            text = part.strip()
            if not text:
                continue
            try:
                asset_id = str(uuid.UUID(text))
            except ValueError:
                raise ProblemError(400, f"{source}: {text[:64]!r} is not an asset id (expected a UUID)") from None
            found[asset_id] = None
    if len(found) > MAX_ASSETS:
        raise ProblemError(400, f"{source}: at most {MAX_ASSETS} assets per request, got {len(found)}")
    return tuple(found)


@final
class InputAssets:
    """The account's uploaded assets, from a mirror of ``nvcf_assets``."""

    def __init__(self, bus: Bus, log: logging.Logger) -> None:
        kv = bus.kv(buckets.ASSETS.name)
        self._mirror = KvMirror(kv, buckets.ASSET, log=log)
        self._kv = TypedKV(kv, buckets.ASSET)
        self._log = log

    async def run(self, bus: Bus, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self._mirror.run(bus, task_status=task_status)

    async def check(self, nca_id: str, asset_ids: Iterable[str]) -> None:
        """404 ``NotFound error: failed to find asset <id>`` unless every asset exists and was uploaded."""
        for asset_id in asset_ids:
            key = buckets.account_item_key(nca_id, asset_id)
            asset = self._mirror.get(key)
            if asset is None or asset.uploaded_at is None:
                asset = await self._fetch(key)
            if asset is None or asset.uploaded_at is None:
                raise ProblemError(404, f"NotFound error: failed to find asset {asset_id}")

    async def _fetch(self, key: str) -> Asset | None:
        try:
            found = await self._kv.get(key)
        except BusError as err:
            raise ProblemError(503, f"the asset store cannot be read: {err}", headers={"Retry-After": "1"}) from err
        return None if found is None else found.value
