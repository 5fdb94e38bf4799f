"""Accounts (NCA ids): ``nvcf-default`` on a single-tenant install, more when multi-account."""

from __future__ import annotations

import re

from nvcf_mono.models.common import int_range
from nvcf_mono.models.deployment import Deployment
from nvcf_mono.structure import WireModel, checked, wire

DEFAULT_ACCOUNT = "nvcf-default"

#: Account ids are key tokens of the buckets (``<ncaId>.<id>``), so no dots, slashes or spaces.
ACCOUNT_ID_PATTERN = r"[A-Za-z0-9_-]{1,128}"
_ACCOUNT_ID_RX = re.compile(ACCOUNT_ID_PATTERN)
#: A JWT ``sub``: printable, no whitespace.
_CLIENT_ID_RX = re.compile(r"[!-~]{1,256}")
MAX_CLIENT_IDS = 100


def account_id_problem(value: str) -> str | None:
    """Why ``value`` cannot be an account id, or None."""
    if _ACCOUNT_ID_RX.fullmatch(value):
        return None
    return "an account id has 1 to 128 characters, each a letter, a digit, '-' or '_'"


def client_id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a client id (a JWT ``sub``), or None."""
    if _CLIENT_ID_RX.fullmatch(value):
        return None
    return "must be 1 to 256 printable characters without spaces"


def _name_check(value: str) -> str | None:
    return None if 4 <= len(value) <= 36 else "size must be between 4 and 36"


def _client_ids_check(value: tuple[str, ...]) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > MAX_CLIENT_IDS:
        return f"size must be between 1 and {MAX_CLIENT_IDS}"
    for item in value:
        problem = client_id_problem(item)
        if problem:
            return f"{item!r}: {problem}"
    return None


@wire
class Account(WireModel):
    """An account and its limits (bucket ``nvcf_accounts``)."""

    nca_id: str
    name: str
    last_updated_at: str
    #: JWT ``sub`` values mapped to this account; a client id belongs to at most one account.
    admin_client_ids: tuple[str, ...] = ()
    max_functions_allowed: int = 50
    max_tasks_allowed: int = 50
    max_telemetries_allowed: int = 10
    max_registry_credentials_allowed: int = 25


@wire
class AccountRequest(WireModel):
    """Body of ``POST``/``PATCH /v2/nvcf/accounts/{ncaId}`` (``name`` is required on create)."""

    name: str | None = checked(None, check=lambda v: None if v is None else _name_check(v))
    admin_client_id: str | None = checked(None, check=lambda v: None if v is None else client_id_problem(v))
    max_functions_allowed: int | None = checked(None, check=int_range(0, 100_000))
    max_tasks_allowed: int | None = checked(None, check=int_range(0, 100_000))
    max_telemetries_allowed: int | None = checked(None, check=int_range(0, 25))
    max_registry_credentials_allowed: int | None = checked(None, check=int_range(0, 50))
    registry_credentials: object = None


@wire
class ClientsRequest(WireModel):
    """Body of ``PATCH /v2/nvcf/accounts/{ncaId}/clients/associate|disassociate``."""

    client_ids: tuple[str, ...] = checked(check=_client_ids_check)


@wire
class AccountResponse(WireModel):
    """``{account}``."""

    account: Account


@wire
class AccountListResponse(WireModel):
    """``{cloudAccounts}``, as NVCF's schema names the list."""

    cloud_accounts: tuple[Account, ...]


@wire
class AccountDeploymentsResponse(WireModel):
    """``{deployments}``: every deployment of one account (super admin)."""

    deployments: tuple[Deployment, ...]


@wire
class GpuUsage(WireModel):
    """One GPU and instance type of the account's deployments.

    ``currentMaxUsage`` and ``currentMinUsage``: the GPUs its deployments may hold at most and hold at
    least (instances times the instance type's GPUs); ``placements``: the instances placed now
    (requested, starting or running).
    """

    gpu: str
    instance_type: str
    current_max_usage: int
    current_min_usage: int
    placements: int


@wire
class GpuUsageResponse(WireModel):
    """``{gpus}``."""

    gpus: tuple[GpuUsage, ...]
