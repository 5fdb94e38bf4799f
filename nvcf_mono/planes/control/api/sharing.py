"""``/v2/nvcf/authorizations/functions``: share a function, or one version, with other accounts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nvcf_mono.auth import scopes as S
from nvcf_mono.contracts import buckets
from nvcf_mono.http.api import Call, ContextHandler, Routes
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.sharing import (
    EVERYONE,
    AuthorizationsListResponse,
    AuthorizationsRequest,
    AuthorizationsResponse,
    AuthorizedParties,
    AuthorizedParty,
    AuthorizedPartyRequest,
    FunctionAuthorizations,
)
from nvcf_mono.planes.control.access import relation, restricted_out
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.service import find_version, not_found
from nvcf_mono.structure import evolve

TAG = "sharing"
routes: Routes[Control] = Routes()
BASE = "/v2/nvcf/authorizations/functions/{functionId}"
VERSION = BASE + "/versions/{versionId}"
SCOPES = (S.AUTHORIZE_CLIENTS,)


async def target(ctl: Control, call: Call[Any], versioned: bool) -> tuple[str, str | None, str]:
    """The function (and version) the caller owns: ``(fid, vid, key)``; 404/403 otherwise."""
    function_id = call.path("functionId")
    if versioned:
        fv, _ = await find_version(
            ctl, call.principal, call.account, function_id, call.path("versionId"), owner_only=True
        )
        return fv.id, fv.version_id, buckets.version_key(fv.id, fv.version_id)
    owned = [fv for fv in await ctl.store.versions_now(function_id) if fv.nca_id == call.account]
    if not owned:
        raise not_found(function_id)
    if not any(relation(ctl.store, call.principal, call.account, fv) == "owner" for fv in owned):
        if any(restricted_out(call.principal, call.account, fv) for fv in owned):
            raise ProblemError(403, "the API key does not grant access to this function")
        raise not_found(function_id)
    return function_id, None, function_id


def view(
    call: Call[Any], function_id: str, version_id: str | None, stored: AuthorizedParties | None
) -> FunctionAuthorizations:
    return FunctionAuthorizations(
        id=function_id,
        nca_id=call.account,
        version_id=version_id,
        authorized_parties=stored.authorized_parties if stored is not None else (),
    )


def where(function_id: str, version_id: str | None) -> str:
    if version_id is None:
        return f"Function '{function_id}'"
    return f"Function '{function_id}' version '{version_id}'"


async def check_party(ctl: Control, call: Call[Any], party: AuthorizedParty) -> None:
    """The party names an existing account other than the owner; a client id must belong to it."""
    if party.nca_id == EVERYONE:
        if party.client_id:
            raise ProblemError(400, "clientId must not be given with the wildcard ('*') authorized party")
        return
    if party.nca_id == call.account:
        raise ProblemError(
            400, f"account '{party.nca_id}' owns the function; the owner cannot be one of its authorized parties"
        )
    account = await ctl.store.accounts.fetch(party.nca_id)
    if account is None:
        raise ProblemError(400, f"authorized party: account '{party.nca_id}' not found")
    if party.client_id and party.client_id not in account.admin_client_ids:
        raise ProblemError(
            400,
            f"authorized party: account '{party.nca_id}' and client '{party.client_id}' are not set up with each other",
        )


async def replace(ctl: Control, call: Call[Any], versioned: bool) -> AuthorizationsResponse:
    function_id, version_id, key = await target(ctl, call, versioned)
    parties = call.body.authorized_parties
    if not parties:
        raise ProblemError(
            400,
            f"authorizedParties must name at least one account; to stop sharing, DELETE {call.request.path}",
        )
    seen: set[str] = set()
    for party in parties:
        if party.nca_id in seen:
            raise ProblemError(400, f"authorized party '{party.nca_id}' is given more than once")
        seen.add(party.nca_id)
    if EVERYONE in seen and len(parties) > 1:
        raise ProblemError(400, "the wildcard authorized party '*' (every account) must be the only party in the list")
    for party in parties:
        await check_party(ctl, call, party)
    record = AuthorizedParties(
        function_id=function_id, nca_id=call.account, version_id=version_id, authorized_parties=parties
    )
    await ctl.store.authorizations.put(key, record)
    return AuthorizationsResponse(function=view(call, function_id, version_id, record))


async def listing(ctl: Control, call: Call[Any], versioned: bool) -> AuthorizationsListResponse:
    function_id, version_id, _ = await target(ctl, call, versioned)
    if version_id is not None:
        # A version's own list only: parties it inherits from the function are listed there.
        own = ctl.store.authorizations.get(buckets.version_key(function_id, version_id))
        return AuthorizationsListResponse(functions=(view(call, function_id, version_id, own),))
    out = []
    stored = ctl.store.authorizations.get(function_id)
    if stored is not None:
        out.append(view(call, function_id, None, stored))
    for fv in ctl.store.versions_of(function_id):
        stored = ctl.store.authorizations.get(buckets.version_key(fv.id, fv.version_id))
        if fv.nca_id == call.account and stored is not None:
            out.append(view(call, function_id, fv.version_id, stored))
    return AuthorizationsListResponse(functions=tuple(out))


async def add(ctl: Control, call: Call[Any], versioned: bool) -> AuthorizationsResponse:
    function_id, version_id, key = await target(ctl, call, versioned)
    party = call.body.authorized_party
    if party.nca_id == EVERYONE:
        raise ProblemError(
            400,
            "the wildcard party '*' cannot be added; to share with every account, POST "
            '{"authorizedParties": [{"ncaId": "*"}]}',
        )
    await check_party(ctl, call, party)
    # A version may start its own list when the function has one it inherits.
    inherited = version_id is not None and ctl.store.authorizations.get(function_id) is not None

    def change(current: AuthorizedParties | None) -> AuthorizedParties:
        if current is None:
            if not inherited:
                raise ProblemError(
                    404,
                    f"{where(function_id, version_id)} has no authorized parties to add to; "
                    "create the list with POST first",
                )
            return AuthorizedParties(
                function_id=function_id, nca_id=call.account, version_id=version_id, authorized_parties=(party,)
            )
        names = {p.nca_id for p in current.authorized_parties}
        if party.nca_id in names:
            raise ProblemError(409, f"{where(function_id, version_id)} is already shared with '{party.nca_id}'")
        if EVERYONE in names:
            raise ProblemError(409, f"{where(function_id, version_id)} is already shared with every account ('*')")
        return evolve(current, authorized_parties=(*current.authorized_parties, party))

    updated = await ctl.store.authorizations.mutate(key, change)
    return AuthorizationsResponse(function=view(call, function_id, version_id, updated))


async def remove(ctl: Control, call: Call[Any], versioned: bool) -> AuthorizationsResponse:
    function_id, version_id, key = await target(ctl, call, versioned)
    party = call.body.authorized_party
    if party.nca_id == EVERYONE:
        raise ProblemError(400, "the wildcard party '*' cannot be removed on its own; DELETE the list instead")

    def change(current: AuthorizedParties | None) -> AuthorizedParties | None:
        if current is None:
            raise ProblemError(404, f"{where(function_id, version_id)} has no authorized parties")
        kept = tuple(p for p in current.authorized_parties if p.nca_id != party.nca_id)
        if len(kept) == len(current.authorized_parties):
            raise ProblemError(404, f"'{party.nca_id}' is not an authorized party of {where(function_id, version_id)}")
        # An emptied list is no list: a later add needs a POST again, as for a fresh function.
        return evolve(current, authorized_parties=kept) if kept else None

    updated = await ctl.store.authorizations.mutate(key, change)
    return AuthorizationsResponse(function=view(call, function_id, version_id, updated))


async def clear(ctl: Control, call: Call[Any], versioned: bool) -> AuthorizationsResponse:
    function_id, version_id, key = await target(ctl, call, versioned)
    # Only this level's list: a function-level clear leaves the versions' own lists in place.
    await ctl.store.authorizations.mutate(key, lambda _: None)
    return AuthorizationsResponse(function=view(call, function_id, version_id, None))


Impl = Callable[[Control, Call[Any], bool], Awaitable[Any]]


def _bound(impl: Impl, versioned: bool, name: str) -> ContextHandler[Control]:
    """A handler for one level, named for its OpenAPI operation id."""

    async def handler(ctl: Control, call: Call[Any]) -> Any:
        return await impl(ctl, call, versioned)

    handler.__name__ = name
    return handler


def both(
    method: str,
    suffix: str,
    impl: Impl,
    names: tuple[str, str],
    summary: str,
    *,
    body: type[Any] | None = None,
    response: type[Any],
    errors: tuple[int, ...],
) -> None:
    for path, versioned, name in ((BASE + suffix, False, names[0]), (VERSION + suffix, True, names[1])):
        scope_text = "one version (its own list)" if versioned else "every version of the function"
        routes.route(
            method,
            path,
            summary=f"{summary} ({scope_text}).",
            tag=TAG,
            scopes=SCOPES,
            body=body,
            response=response,
            errors=errors,
            cross_account=True,
        )(_bound(impl, versioned, name))


both(
    "POST",
    "",
    replace,
    ("authorize_function", "authorize_function_version"),
    "Replace the accounts a function is shared with",
    body=AuthorizationsRequest,
    response=AuthorizationsResponse,
    errors=(404,),
)
both(
    "GET",
    "",
    listing,
    ("list_function_authorizations", "list_function_version_authorizations"),
    "List the accounts a function is shared with",
    response=AuthorizationsListResponse,
    errors=(404,),
)
both(
    "PATCH",
    "/add",
    add,
    ("add_function_authorized_party", "add_function_version_authorized_party"),
    "Share with one more account",
    body=AuthorizedPartyRequest,
    response=AuthorizationsResponse,
    errors=(404, 409),
)
both(
    "PATCH",
    "/remove",
    remove,
    ("remove_function_authorized_party", "remove_function_version_authorized_party"),
    "Stop sharing with one account",
    body=AuthorizedPartyRequest,
    response=AuthorizationsResponse,
    errors=(404,),
)
both(
    "DELETE",
    "",
    clear,
    ("delete_function_authorizations", "delete_function_version_authorizations"),
    "Stop sharing with every account",
    response=AuthorizationsResponse,
    errors=(404,),
)
