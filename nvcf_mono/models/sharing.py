"""Function sharing: the accounts a function (or one version) is authorized for."""

from __future__ import annotations

from nvcf_mono.models.common import max_len
from nvcf_mono.structure import WireModel, checked, wire

#: The party that stands for every account.
EVERYONE = "*"


def _nca_check(value: str) -> str | None:
    if not value.strip():
        return "must not be blank"
    return None if len(value) <= 128 else "size must be between 1 and 128"


@wire
class AuthorizedParty(WireModel):
    """An account allowed to use a function (``clientId`` is deprecated and kept for clients)."""

    nca_id: str = checked(check=_nca_check)
    client_id: str | None = checked(None, check=max_len(256))


@wire
class AuthorizedParties(WireModel):
    """Stored list (bucket ``nvcf_authorizations``, key ``<fid>`` or ``<fid>.<vid>``)."""

    function_id: str
    nca_id: str
    authorized_parties: tuple[AuthorizedParty, ...]
    version_id: str | None = None


@wire
class AuthorizationsRequest(WireModel):
    """Body of ``POST /v2/nvcf/authorizations/functions/{fid}[/versions/{vid}]``."""

    authorized_parties: tuple[AuthorizedParty, ...]


@wire
class AuthorizedPartyRequest(WireModel):
    """Body of ``PATCH .../add`` and ``.../remove``."""

    authorized_party: AuthorizedParty


@wire
class FunctionAuthorizations(WireModel):
    """One function (or version) and its parties, as returned."""

    id: str
    nca_id: str
    authorized_parties: tuple[AuthorizedParty, ...]
    version_id: str | None = None


@wire
class AuthorizationsResponse(WireModel):
    """``{function: {...}}``."""

    function: FunctionAuthorizations


@wire
class AuthorizationsListResponse(WireModel):
    """``{functions: [...]}``."""

    functions: tuple[FunctionAuthorizations, ...]
