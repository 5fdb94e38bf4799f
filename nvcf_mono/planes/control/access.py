"""Who may see which function: owners, accounts it is shared with, and API-key resource limits."""

from __future__ import annotations

from typing import Literal

from nvcf_mono.auth.principal import Principal
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.models.sharing import AuthorizedParties
from nvcf_mono.planes.control.store import ControlStore

Relation = Literal["owner", "shared"]


def shared_with(store: ControlStore, function_id: str, version_id: str, account: str) -> bool:
    """Is the version shared with ``account`` (at function or version level, or with everyone)?"""
    for key in (function_id, f"{function_id}.{version_id}"):
        parties: AuthorizedParties | None = store.authorizations.get(key)
        if parties is not None and any(p.nca_id in (account, "*") for p in parties.authorized_parties):
            return True
    return False


def relation(store: ControlStore, principal: Principal, account: str, fv: FunctionVersion) -> Relation | None:
    """How the caller (acting for ``account``) relates to a version, after API-key resource limits."""
    if fv.nca_id == account:
        rel: Relation = "owner"
    elif shared_with(store, fv.id, fv.version_id, account):
        rel = "shared"
    else:
        return None
    res = principal.resources
    if res is not None and not res.allows_function(fv.id, fv.version_id, own_account=rel == "owner"):
        return None
    return rel


def restricted_out(principal: Principal, account: str, fv: FunctionVersion) -> bool:
    """True when the version is the account's own but the caller's key does not reach it (403)."""
    res = principal.resources
    return fv.nca_id == account and res is not None and not res.allows_function(fv.id, fv.version_id, own_account=True)
