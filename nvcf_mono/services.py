"""Typed handles for what plugins share: services one plugin provides, extension points many extend."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast, final

import attrs

from nvcf_mono.errors import NvcfMonoError

T = TypeVar("T")


@final
@attrs.frozen
class ServiceKey(Generic[T]):
    """Names one service of type ``T`` (e.g. ``SECRETS: ServiceKey[SecretBox]``)."""

    name: str


@final
@attrs.frozen
class ExtensionPoint(Generic[T]):
    """Names a list of contributions of type ``T`` (e.g. ``AUTH_STRATEGIES: ExtensionPoint[AuthStrategy]``)."""

    name: str


@attrs.frozen
class Extension(Generic[T]):
    """One contribution to an extension point, with the plugin that made it."""

    owner: str
    value: T


class ServiceError(NvcfMonoError):
    """A service was provided twice, is missing, or the registry is already frozen."""


@final
@attrs.define
class ServiceRegistry:
    """Filled during ``setup()``, then frozen before any plugin runs."""

    _services: dict[ServiceKey[Any], tuple[str, Any]] = attrs.field(factory=dict, init=False)
    _extensions: dict[ExtensionPoint[Any], list[Extension[Any]]] = attrs.field(factory=dict, init=False)
    _frozen: bool = attrs.field(default=False, init=False)

    def provide(self, key: ServiceKey[T], value: T, *, owner: str) -> None:
        """Register the one implementation of ``key``."""
        self._check_open()
        if key in self._services:
            raise ServiceError(f"service {key.name!r} is provided by both {self._services[key][0]!r} and {owner!r}")
        self._services[key] = (owner, value)

    def extend(self, point: ExtensionPoint[T], value: T, *, owner: str) -> None:
        """Add a contribution to ``point``; contributions keep registration (plugin start) order."""
        self._check_open()
        self._extensions.setdefault(point, []).append(Extension(owner, value))

    def freeze(self) -> None:
        """Forbid further registrations."""
        self._frozen = True

    def get(self, key: ServiceKey[T]) -> T:
        """The service for ``key``; raises :class:`ServiceError` naming it when nobody provides it."""
        try:
            return cast(T, self._services[key][1])
        except KeyError:
            raise ServiceError(f"no enabled plugin provides service {key.name!r}") from None

    def find(self, key: ServiceKey[T]) -> T | None:
        """The service for ``key``, or ``None``."""
        entry = self._services.get(key)
        return None if entry is None else cast(T, entry[1])

    def extensions(self, point: ExtensionPoint[T]) -> tuple[Extension[T], ...]:
        """Every contribution to ``point``."""
        return tuple(self._extensions.get(point, ()))

    def _check_open(self) -> None:
        if self._frozen:
            raise ServiceError("services can only be registered during setup()")
