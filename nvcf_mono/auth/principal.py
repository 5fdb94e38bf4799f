"""The authenticated caller: account, scopes, and (for API keys) the resources it may reach."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

from nvcf_mono.errors import NvcfMonoError

#: What vouched for a caller: admin_token, api_key, jwt, worker (the built-in strategies), or a plugin
#: strategy's own name (any lower-case name).
#: Only ``admin_token`` and ``jwt`` callers manage API keys; any other kind is treated like an API key there.
PrincipalKind = str
_KIND = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def _kind_check(_: object, __: object, value: str) -> None:
    if not _KIND.match(value):
        raise ValueError(
            f"Principal.kind must be a lower-case name such as 'my_tokens' (1-64 of a-z0-9_-), got {value!r}"
        )


class AuthError(NvcfMonoError):
    """The caller is not let in: 401 (no or bad credential), 403 (scope or resource), 404 (account)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@attrs.frozen(kw_only=True)
class Resources:
    """An API key's resource entries (``account-functions:*``, ``function:<fid>/<vid>``, ...)."""

    account_functions: bool = False
    authorized_functions: bool = False
    functions: frozenset[tuple[str, str]] = frozenset()
    account_tasks: bool = False
    tasks: frozenset[str] = frozenset()

    @classmethod
    def from_entries(cls, entries: Iterable[Mapping[str, str]]) -> Resources:
        """Build from ``[{"type": "function", "id": "<fid>/<vid|*>"}, ...]``; malformed ids are ignored."""
        account_functions = authorized_functions = account_tasks = False
        functions: set[tuple[str, str]] = set()
        tasks: set[str] = set()
        for entry in entries:
            kind, ident = entry.get("type", ""), entry.get("id", "")
            if kind == "account-functions" and ident == "*":
                account_functions = True
            elif kind == "authorized-functions" and ident == "*":
                authorized_functions = True
            elif kind == "account-tasks" and ident == "*":
                account_tasks = True
            elif kind == "function" and ident.count("/") == 1 and all(ident.split("/")):
                fid, vid = ident.split("/")
                functions.add((fid, vid))
            elif kind == "task" and ident:
                tasks.add(ident)
        return cls(
            account_functions=account_functions,
            authorized_functions=authorized_functions,
            functions=frozenset(functions),
            account_tasks=account_tasks,
            tasks=frozenset(tasks),
        )

    def entries(self) -> list[dict[str, str]]:
        """The resource entries, as an API key stores them."""
        out = []
        if self.account_functions:
            out.append({"id": "*", "type": "account-functions"})
        if self.authorized_functions:
            out.append({"id": "*", "type": "authorized-functions"})
        out.extend({"id": f"{fid}/{vid}", "type": "function"} for fid, vid in sorted(self.functions))
        if self.account_tasks:
            out.append({"id": "*", "type": "account-tasks"})
        out.extend({"id": t, "type": "task"} for t in sorted(self.tasks))
        return out

    def allows_function(self, function_id: str, version_id: str | None, *, own_account: bool) -> bool:
        """May the key reach this function (an own-account one, or one shared with its account)?"""
        if own_account and self.account_functions:
            return True
        if not own_account and self.authorized_functions:
            return True
        return (function_id, "*") in self.functions or (
            version_id is not None and (function_id, version_id) in self.functions
        )

    def allows_task(self, task_id: str | None) -> bool:
        """May the key reach this task (None: tasks in general, e.g. launching one)?"""
        return self.account_tasks or (task_id is not None and task_id in self.tasks)

    def covers(self, other: Resources) -> bool:
        """Does this set include everything ``other`` grants (a key may not mint more than it has)?"""
        if other.account_functions and not self.account_functions:
            return False
        if other.authorized_functions and not self.authorized_functions:
            return False
        if other.account_tasks and not self.account_tasks:
            return False
        for fid, vid in other.functions:
            if not (self.account_functions or (fid, "*") in self.functions or (fid, vid) in self.functions):
                return False
        return all(self.account_tasks or t in self.tasks for t in other.tasks)


@attrs.frozen(kw_only=True)
class Principal:
    """Who is calling. ``resources`` None means the whole of ``account`` (JWTs, the admin token)."""

    kind: PrincipalKind = attrs.field(validator=_kind_check)
    subject: str
    account: str
    scopes: frozenset[str]
    resources: Resources | None = None
    key_id: str | None = None

    @property
    def super_admin(self) -> bool:
        """May act on other accounts (``admin:<scope>`` authorities)."""
        return any(s.startswith("admin:") for s in self.scopes)

    def has(self, scope: str) -> bool:
        """Holds ``scope`` (an API key's ``apikey:<scope>`` counts the same)."""
        return scope in self.scopes

    def require(self, *scopes: str) -> None:
        """403 unless the caller holds one of ``scopes``."""
        if not any(s in self.scopes for s in scopes):
            wanted = " or ".join(repr(s) for s in scopes)
            raise AuthError(403, f"the credential lacks the scope {wanted}")
