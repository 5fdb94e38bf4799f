"""``/v2/nvcf/assets``: input files for invocations, uploaded and downloaded through pre-signed links.

Like S3 pre-signed URLs, the links carry their own authorization (an expiry and an HMAC over the
operation, asset and expiry, keyed from the platform secret), so the upload and download routes take
no bearer token and any node holding the platform secret can check them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Literal

from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError

from nvcf_mono.auth import scopes as S
from nvcf_mono.bus.errors import BusError
from nvcf_mono.bus.upload_room import UploadRoom, upload_room
from nvcf_mono.contracts import buckets
from nvcf_mono.http import signed_links
from nvcf_mono.http.api import Call, Routes
from nvcf_mono.http.downloads import stream_object
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.asset import (
    Asset,
    AssetInfo,
    AssetListResponse,
    AssetResponse,
    ContentRedirect,
    CreateAssetRequest,
    CreatedAsset,
    same_content_type,
)
from nvcf_mono.models.common import is_uuid, new_id, now_iso
from nvcf_mono.planes.control.account_limits import one_more
from nvcf_mono.planes.control.context import Control
from nvcf_mono.structure import evolve

TAG = "assets"
routes: Routes[Control] = Routes()
LinkOp = Literal["upload", "download"]
_CHUNK = 256 * 1024


def _view(asset: Asset) -> AssetInfo:
    return AssetInfo(
        asset_id=asset.asset_id,
        content_type=asset.content_type,
        description=asset.description,
        created_at=asset.created_at,
        size=asset.size,
        uploaded_at=asset.uploaded_at,
    )


def _not_found(asset_id: str) -> ProblemError:
    return ProblemError(404, f"Asset '{asset_id}' not found")


#: What an asset link's signature covers besides the asset and the operation.
PURPOSE = "nvcf-asset-link"


def link(ctl: Control, op: LinkOp, asset_id: str) -> str:
    signed = signed_links.query(ctl.keyring.asset_link_key, PURPOSE, f"{op}\n{asset_id}", ctl.config.asset_link_ttl)
    return f"{ctl.api_url}/v2/nvcf/assets/{asset_id}/{op}?{signed}"


def check_link(ctl: Control, call: Call[None], op: LinkOp) -> str:
    """The asset id of a valid, unexpired link; 403 otherwise (checked before any lookup)."""
    asset_id = call.path("assetId")
    signed_links.check(
        ctl.keyring.asset_link_key,
        PURPOSE,
        f"{op}\n{asset_id}",
        call.query("expires"),
        call.query("signature"),
        what=f"{op} link",
    )
    if not is_uuid(asset_id):
        raise _not_found(asset_id)
    return asset_id


async def find_any(ctl: Control, asset_id: str) -> Asset | None:
    """An asset by id alone (links do not name the account; ids are unique)."""
    for asset in ctl.store.assets.values():
        if asset.asset_id == asset_id:
            return asset
    # Created through another node a moment ago: the mirror may not have it yet.
    for key in await ctl.store.assets.kv.kv.keys(f"*.{asset_id}"):
        found = await ctl.store.assets.fetch(key)
        if found is not None:
            return found
    return None


async def own(ctl: Control, call: Call[None]) -> Asset:
    asset_id = call.path("assetId")
    if not is_uuid(asset_id):
        raise _not_found(asset_id)
    asset = await ctl.store.assets.fetch(buckets.account_item_key(call.account, asset_id))
    if asset is None:
        raise _not_found(asset_id)
    return asset


@routes.route(
    "POST",
    "/v2/nvcf/assets",
    summary="Create an asset; PUT its content to the returned uploadUrl (no bearer; same Content-Type).",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    body=CreateAssetRequest,
    response=CreatedAsset,
    cross_account=True,
)
async def create_asset(ctl: Control, call: Call[CreateAssetRequest]) -> CreatedAsset:
    asset = Asset(
        asset_id=new_id(),
        nca_id=call.account,
        content_type=call.body.content_type.strip(),
        description=call.body.description,
        created_at=now_iso(),
    )
    most = ctl.config.max_account_assets
    async with one_more(
        ctl,
        count=lambda: sum(1 for a in ctl.store.assets.values() if a.nca_id == call.account),
        most=most or None,
        refusal=f"the account keeps {most} assets, the most it may (plugins.control.max_account_assets); "
        "delete assets it no longer needs",
    ):
        await ctl.store.assets.create(buckets.account_item_key(asset.nca_id, asset.asset_id), asset)
    return CreatedAsset(
        asset_id=asset.asset_id,
        upload_url=link(ctl, "upload", asset.asset_id),
        content_type=asset.content_type,
        description=asset.description,
    )


@routes.route(
    "GET",
    "/v2/nvcf/assets",
    summary="List the account's assets.",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    response=AssetListResponse,
    cross_account=True,
)
async def list_assets(ctl: Control, call: Call[None]) -> AssetListResponse:
    mine = [a for a in ctl.store.assets.values() if a.nca_id == call.account]
    mine.sort(key=lambda a: (a.created_at, a.asset_id))
    return AssetListResponse(assets=tuple(_view(a) for a in mine))


@routes.route(
    "GET",
    "/v2/nvcf/assets/{assetId}",
    summary="Read an asset's metadata.",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    response=AssetResponse,
    errors=(404,),
    cross_account=True,
)
async def get_asset(ctl: Control, call: Call[None]) -> AssetResponse:
    return AssetResponse(asset=_view(await own(ctl, call)))


@routes.route(
    "DELETE",
    "/v2/nvcf/assets/{assetId}",
    summary="Delete an asset and its content.",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    errors=(404,),
    cross_account=True,
)
async def delete_asset(ctl: Control, call: Call[None]) -> None:
    asset = await own(ctl, call)
    await ctl.bus.objects(buckets.ASSET_CONTENT.name).delete(buckets.asset_object(asset.nca_id, asset.asset_id))
    await ctl.store.assets.mutate(buckets.account_item_key(asset.nca_id, asset.asset_id), lambda _: None)


@routes.route(
    "GET",
    "/v2/nvcf/assets/{assetId}/content-redirect",
    summary="A pre-signed link to download the asset's content (no bearer needed; expires).",
    tag=TAG,
    scopes=(S.INVOKE_FUNCTION,),
    response=ContentRedirect,
    errors=(404,),
    cross_account=True,
)
async def get_asset_content_redirect(ctl: Control, call: Call[None]) -> ContentRedirect:
    asset = await own(ctl, call)
    return ContentRedirect(presigned_url=link(ctl, "download", asset.asset_id))


@routes.route(
    "PUT",
    "/v2/nvcf/assets/{assetId}/upload",
    summary="Upload an asset's content through its pre-signed uploadUrl (replaces earlier content).",
    description="Authorized by the link itself: send no bearer. The Content-Type must be the one the asset "
    "was created with; the body is streamed to storage and may not exceed the platform's asset size limit.",
    tag=TAG,
    auth="none",
    raw_body="*/*",
    # 200 with an empty body, as S3 answers a pre-signed PUT.
    raw_response="application/octet-stream",
    params=signed_links.LINK_PARAMS,
    errors=(403, 404, 413, 503, 507),
)
async def upload_asset_content(ctl: Control, call: Call[None]) -> web.StreamResponse:
    asset_id = check_link(ctl, call, "upload")
    asset = await find_any(ctl, asset_id)
    if asset is None:
        raise _not_found(asset_id)
    sent_type = call.request.headers.get("Content-Type")
    if sent_type is None or not same_content_type(sent_type, asset.content_type):
        raise ProblemError(
            400,
            f"Content-Type must be {asset.content_type!r}, as the asset was created with; got {sent_type!r}",
        )
    room = upload_room(ctl.bus, ctl.settings)
    limit, too_large = await _upload_limit(ctl, asset, room)
    declared = call.request.content_length
    with ctl.asset_uploads.flow(asset.nca_id) as flow:
        quota_left, over_quota = _account_quota(ctl, asset)
        if declared is not None:
            if declared > limit:
                raise too_large
            flow.reach(declared, quota_left, over_quota)

        async def body() -> AsyncIterator[bytes]:
            received = 0
            try:
                async for chunk in call.request.content.iter_chunked(_CHUNK):
                    received += len(chunk)
                    if received > limit:
                        raise too_large
                    flow.reach(received, quota_left, over_quota)
                    yield chunk
            except (ClientPayloadError, HttpProcessingError, ConnectionError) as err:
                raise ProblemError(400, f"the upload was cut short after {received} bytes: {err}") from err

        name = buckets.asset_object(asset.nca_id, asset.asset_id)
        objects = ctl.bus.objects(buckets.ASSET_CONTENT.name)
        try:
            # A failed put (too large, cut short) leaves any earlier content in place.
            held = room.hold(body(), _no_room, credit=asset.size or 0, declared=declared)
            async with aclosing(held):
                info = await objects.put(name, held, metadata={"contentType": asset.content_type})
        except BusError as err:
            raise ProblemError(503, f"the asset could not be stored: {err}", headers={"Retry-After": "1"}) from err
        uploaded = now_iso()

        def record(current: Asset | None) -> Asset | None:
            if current is None:
                raise _not_found(asset_id)
            return evolve(current, size=info.size, uploaded_at=uploaded)

        # Recorded before the flow ends: an upload that begins meanwhile sees it in one or the other.
        try:
            await ctl.store.assets.mutate(buckets.account_item_key(asset.nca_id, asset.asset_id), record)
        except ProblemError:
            await objects.delete(name)  # deleted while uploading: keep no orphan content
            raise
    return web.Response(status=200, content_type="application/octet-stream")


_CLOSE = {"Connection": "close"}  # refused before the body is read: the connection cannot serve another


async def _upload_limit(ctl: Control, asset: Asset, room: UploadRoom) -> tuple[int, ProblemError]:
    """The most an upload of ``asset`` may bring, and the error for more: whichever limit is nearest.

    The asset size limit, and the room uploads have left in the message store (its reserve is kept
    for everyone's invocations; the content this upload replaces counts as freed). The room is shared
    with the uploads under way (``room.hold``), as is the account's quota (:func:`_account_quota`).
    """
    config = ctl.config
    limits = [
        (
            config.max_asset_size,
            ProblemError(413, f"the asset exceeds the limit of {config.max_asset_size} bytes", headers=_CLOSE),
        )
    ]
    try:
        left = await room.left()
    except BusError as err:
        raise ProblemError(503, f"the store's room cannot be read now: {err}", headers={"Retry-After": "1"}) from err
    if left is not None:
        limits.append((left + (asset.size or 0), _no_room()))
    return min(limits, key=lambda item: item[0])


def _account_quota(ctl: Control, asset: Asset) -> tuple[int | None, Callable[[int], ProblemError]]:
    """What ``max_account_asset_bytes`` leaves this upload beside the account's other assets (None: no
    quota), and its 413 given what the account's other uploads under way bring (:meth:`Flow.reach`).
    """
    quota = ctl.config.max_account_asset_bytes
    used = 0
    if quota:
        used = sum(
            a.size or 0 for a in ctl.store.assets.values() if a.nca_id == asset.nca_id and a.asset_id != asset.asset_id
        )

    def over(others: int) -> ProblemError:
        under_way = f" and its uploads under way bring {others}" if others else ""
        detail = (
            f"the account's assets may hold {quota} bytes together and its other assets hold {used}"
            f"{under_way}: this upload does not fit; delete assets it no longer needs"
        )
        return ProblemError(413, detail, headers=_CLOSE)

    return (quota - used if quota else None), over


def _no_room() -> ProblemError:
    detail = (
        "the platform's message store has no room for this upload: the rest is kept for queued requests "
        "and results. Delete assets or task results no longer needed, or ask the operator for a larger store"
    )
    return ProblemError(507, detail, headers=_CLOSE)


@routes.route(
    "GET",
    "/v2/nvcf/assets/{assetId}/download",
    summary="Download an asset's content through a pre-signed link from content-redirect.",
    description="Authorized by the link itself: send no bearer. Answers with the asset's Content-Type.",
    tag=TAG,
    auth="none",
    raw_response="*/*",
    params=signed_links.LINK_PARAMS,
    errors=(403, 404, 503),
)
async def download_asset_content(ctl: Control, call: Call[None]) -> web.StreamResponse:
    asset_id = check_link(ctl, call, "download")
    asset = await find_any(ctl, asset_id)
    if asset is None:
        raise _not_found(asset_id)
    objects = ctl.bus.objects(buckets.ASSET_CONTENT.name)
    return await stream_object(
        call.request,
        objects.open(buckets.asset_object(asset.nca_id, asset.asset_id)),
        headers={"Content-Type": asset.content_type},
        missing=f"Asset '{asset_id}' has no content yet: upload it first",
        what=f"asset {asset_id}",
        log=ctl.log,
    )
