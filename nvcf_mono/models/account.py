"""Accounts (NCA ids): ``nvcf-default`` on a single-tenant install, more when multi-account."""

from __future__ import annotations

from nvcf_mono.models.common import int_range
from nvcf_mono.structure import WireModel, checked, wire

DEFAULT_ACCOUNT = "nvcf-default"


def _name_check(value: str) -> str | None:
    return None if 4 <= len(value) <= 36 else "size must be between 4 and 36"


@wire
class Account(WireModel):
    """An account and its limits (bucket ``nvcf_accounts``)."""

    nca_id: str
    name: str
    last_updated_at: str
    admin_client_ids: tuple[str, ...] = ()
    max_functions_allowed: int = 50
    max_tasks_allowed: int = 50
    max_telemetries_allowed: int = 10
    max_registry_credentials_allowed: int = 25


@wire
class AccountRequest(WireModel):
    """Body of ``POST``/``PATCH /v2/nvcf/accounts/{ncaId}``."""

    name: str | None = checked(None, check=lambda v: None if v is None else _name_check(v))
    admin_client_id: str | None = None
    max_functions_allowed: int | None = checked(None, check=int_range(0, 100_000))
    max_tasks_allowed: int | None = checked(None, check=int_range(0, 100_000))
    max_telemetries_allowed: int | None = checked(None, check=int_range(0, 25))
    max_registry_credentials_allowed: int | None = checked(None, check=int_range(0, 50))
    registry_credentials: object = None


@wire
class ClientsRequest(WireModel):
    """Body of ``PATCH /v2/nvcf/accounts/{ncaId}/clients/associate|disassociate``."""

    client_ids: tuple[str, ...]


@wire
class AccountResponse(WireModel):
    """``{account}``."""

    account: Account


@wire
class AccountListResponse(WireModel):
    """``{accounts}``."""

    accounts: tuple[Account, ...]
