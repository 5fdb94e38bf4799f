"""Assets: input files uploaded to the platform's object store, referenced by invocations."""

from __future__ import annotations

from nvcf_mono.models.common import max_len
from nvcf_mono.structure import WireModel, checked, wire


@wire
class Asset(WireModel):
    """An asset's metadata (bucket ``nvcf_assets``); the content is object ``<ncaId>/<assetId>``."""

    asset_id: str
    nca_id: str
    content_type: str
    description: str
    created_at: str
    size: int | None = None
    uploaded_at: str | None = None


@wire
class CreateAssetRequest(WireModel):
    """Body of ``POST /v2/nvcf/assets``."""

    content_type: str = checked(check=max_len(256))
    description: str = checked(check=max_len(256))


@wire
class CreatedAsset(WireModel):
    """Response of ``POST /v2/nvcf/assets``: PUT the content to ``uploadUrl``."""

    asset_id: str
    upload_url: str
    content_type: str
    description: str


@wire
class AssetInfo(WireModel):
    """An asset in listings."""

    asset_id: str
    content_type: str
    description: str
    created_at: str
    size: int | None = None


@wire
class AssetResponse(WireModel):
    """``{asset}``."""

    asset: AssetInfo


@wire
class AssetListResponse(WireModel):
    """``{assets}``."""

    assets: tuple[AssetInfo, ...]


@wire
class ContentRedirect(WireModel):
    """``{presignedUrl}``: a GET link to the content, valid for a while."""

    presigned_url: str
