"""Which function a model name means, as NVCF's gateway decides it.

In this order: the ``X-NVCF-Function-ID`` header (``X-NVCF-Function-Version-ID`` pins a version); a model
alias (the gateway's ``models`` setting, or a function tag ``model=<name>``); a model of the form
``<functionId>/<model>``. The function gets the request with ``model`` rewritten to its downstream name:
the part after the slash, the alias setting's ``/<model>``, else the name the caller used.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from nvcf_mono.auth.principal import Principal
from nvcf_mono.contracts.ids import is_id, shown
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import parse_iso
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation.llm.errors import GatewayError
from nvcf_mono.planes.invocation.routing import RoutingTable

FUNCTION_HEADER = "X-NVCF-Function-ID"
VERSION_HEADER = "X-NVCF-Function-Version-ID"
#: A function tag that registers it under a model name: ``model=llama-3-8b``.
MODEL_TAG = "model="


@attrs.frozen
class Alias:
    """A model name and the function that serves it."""

    name: str
    function_id: str
    downstream: str
    #: From the gateway's settings (served to every account allowed to invoke it), else from a tag.
    configured: bool = False


@attrs.frozen
class Target:
    fv: FunctionVersion
    downstream: str


def not_found(model: str) -> GatewayError:
    return GatewayError(404, f"The model '{model}' does not exist or you do not have access to it.", param="model")


def configured_aliases(models: Mapping[str, str]) -> list[Alias]:
    aliases = []
    for name, value in models.items():
        function_id, _, downstream = value.partition("/")
        aliases.append(Alias(name, function_id, downstream or name, configured=True))
    return aliases


@attrs.frozen
class _Tagged:
    """A function version registered under a model name by its tag."""

    alias: Alias
    fv: FunctionVersion
    created: float


class ModelCatalog:
    """Model names over the invocation plane's routing table; the tag index follows its generation.

    A call looks at the functions of its model name only, however many functions there are.
    """

    def __init__(self, routing: RoutingTable, models: Mapping[str, str]) -> None:
        self.routing = routing
        self._configured = {alias.name: alias for alias in configured_aliases(models)}
        self._seen = -1
        self._tagged: dict[str, list[_Tagged]] = {}

    def _tags(self) -> dict[str, list[_Tagged]]:
        if self._seen != self.routing.functions.generation:
            self._seen = self.routing.functions.generation
            index: dict[str, list[_Tagged]] = {}
            for fv in self.routing.functions.values():
                for tag in fv.tags or ():
                    if tag.startswith(MODEL_TAG) and len(tag) > len(MODEL_TAG):
                        name = tag[len(MODEL_TAG) :]
                        index.setdefault(name, []).append(_Tagged(Alias(name, fv.id, name), fv, created_epoch(fv)))
            self._tagged = index
        return self._tagged

    def find(self, principal: Principal, name: str) -> tuple[Alias, FunctionVersion] | None:
        """What the model ``name`` means to the caller: the settings' alias over tags, its own account's
        tags over shared functions', newer versions over older.
        """
        configured = self._configured.get(name)
        if configured is not None:
            versions = self.routing.versions_of(configured.function_id)
            allowed = [fv for fv in versions if self.routing.may_invoke(principal, fv)]
            if allowed:
                return configured, max(allowed, key=created_epoch)
        best: _Tagged | None = None
        rank = (False, 0.0)
        for tagged in self._tags().get(name, ()):
            key = (tagged.fv.nca_id == principal.account, tagged.created)
            if (best is None or key > rank) and self.routing.may_invoke(principal, tagged.fv):
                best, rank = tagged, key
        return None if best is None else (best.alias, best.fv)

    def visible(self, principal: Principal) -> dict[str, tuple[Alias, FunctionVersion]]:
        """Every model name the caller may use, as :meth:`find` tells each."""
        found = {}
        for name in sorted({*self._tags(), *self._configured}):
            hit = self.find(principal, name)
            if hit is not None:
                found[name] = hit
        return found

    async def target(self, principal: Principal, headers: Mapping[str, str], model: str) -> Target:
        """The function version to call and the model name it gets; GatewayError 404 when none."""
        function_id = headers.get(FUNCTION_HEADER)
        if function_id is not None:
            version_id = headers.get(VERSION_HEADER)
            fv = await self._resolve(principal, function_id.strip(), version_id and version_id.strip(), model)
            alias = self.find(principal, model)
            if alias is not None and alias[0].function_id == fv.id:
                return Target(fv, alias[0].downstream)
            return Target(fv, model.split("/", 1)[1] if model.startswith(f"{fv.id}/") else model)
        alias = self.find(principal, model)
        if alias is not None:
            return Target(await self._resolve(principal, alias[0].function_id, None, model), alias[0].downstream)
        function_id, slash, downstream = model.partition("/")
        if slash and downstream and is_id(function_id):
            return Target(await self._resolve(principal, function_id, None, model), downstream)
        raise not_found(model)

    async def _resolve(
        self, principal: Principal, function_id: str, version_id: str | None, model: str
    ) -> FunctionVersion:
        for name, value in ((FUNCTION_HEADER, function_id), (VERSION_HEADER, version_id)):
            if value is not None and not is_id(value):
                raise GatewayError(400, f"{name} is not a valid id: {shown(value)!r}")
        try:
            return await self.routing.resolve_current(principal, function_id, version_id)
        except ProblemError as err:
            if err.status == 404:
                raise GatewayError(404, f"{not_found(model).message} ({err.detail})", param="model") from None
            raise


def created_epoch(fv: FunctionVersion) -> float:
    """When the version was created, in seconds since the epoch (0 when unreadable)."""
    try:
        return parse_iso(fv.created_at).timestamp()
    except ValueError:
        return 0.0
