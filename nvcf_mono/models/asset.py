"""Assets: input files uploaded to the platform's object store, referenced by invocations."""

from __future__ import annotations

import re

from nvcf_mono.models.common import max_len
from nvcf_mono.structure import WireModel, checked, wire

_TOKEN = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*"
_CONTENT_TYPE_RX = re.compile(rf"^{_TOKEN}/{_TOKEN}(\s*;\s*{_TOKEN}=\S+)*$")


def content_type_check(value: str) -> str | None:
    """A MIME type such as ``image/png`` or ``text/plain; charset=utf-8``."""
    if len(value) > 256:
        return "size must be between 1 and 256"
    if not _CONTENT_TYPE_RX.match(value.strip()):
        return "must be a MIME type such as 'image/png' or 'application/octet-stream'"
    return None


def same_content_type(a: str, b: str) -> bool:
    """Equal MIME types (case and the spacing around parameters do not matter)."""

    def norm(value: str) -> str:
        return ";".join(part.strip() for part in value.lower().split(";"))

    return norm(a) == norm(b)


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

    content_type: str = checked(check=content_type_check)
    description: str = checked(check=max_len(256))


@wire
class CreatedAsset(WireModel):
    """Response of ``POST /v2/nvcf/assets``: PUT the content to ``uploadUrl`` with that ``Content-Type``."""

    asset_id: str
    upload_url: str
    content_type: str
    description: str


@wire
class AssetInfo(WireModel):
    """An asset in listings; ``size`` and ``uploadedAt`` once its content has been uploaded."""

    asset_id: str
    content_type: str
    description: str
    created_at: str
    size: int | None = None
    uploaded_at: str | None = None


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
