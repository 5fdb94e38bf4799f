"""What the control plane's handlers share: config, store, keys, and the bus, bound when it runs."""

from __future__ import annotations

import logging
from typing import final

import attrs

from nvcf_mono.auth.keystore import ApiKeyStore
from nvcf_mono.auth.secret import Keyring
from nvcf_mono.auth.tokens import TokenSigner
from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.mirror import Signal
from nvcf_mono.config.model import Settings
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.control.config import ControlConfig
from nvcf_mono.planes.control.store import ControlStore
from nvcf_mono.plugin import Endpoints
from nvcf_mono.reval.engine import ChartRendering, Validator


@final
@attrs.define
class Control:
    """Late-bound dependencies of the API handlers (routes answer 503 until the plugin runs)."""

    config: ControlConfig
    settings: Settings
    log: logging.Logger
    wake: Signal = attrs.field(factory=Signal)
    _store: ControlStore | None = None
    _bus: Bus | None = None
    _keyring: Keyring | None = None
    _keys: ApiKeyStore | None = None
    _endpoints: Endpoints | None = None
    #: Renders Helm charts (the ``helm`` plugin's); None where that plugin is not enabled.
    charts: ChartRendering | None = None

    def bind(
        self, *, store: ControlStore, bus: Bus, keyring: Keyring, keys: ApiKeyStore | None, endpoints: Endpoints
    ) -> None:
        self._store, self._bus, self._keyring, self._keys, self._endpoints = store, bus, keyring, keys, endpoints

    @property
    def store(self) -> ControlStore:
        if self._store is None:
            raise ProblemError(503, "the control plane is starting", headers={"Retry-After": "1"})
        return self._store

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise ProblemError(503, "the control plane is starting", headers={"Retry-After": "1"})
        return self._bus

    @property
    def keyring(self) -> Keyring:
        if self._keyring is None:
            raise ProblemError(503, "the control plane is starting", headers={"Retry-After": "1"})
        return self._keyring

    @property
    def keys(self) -> ApiKeyStore:
        if self._keys is None:
            raise ProblemError(503, "API keys are not enabled on this node (plugin auth_api_key)")
        return self._keys

    @property
    def tokens(self) -> TokenSigner:
        return TokenSigner(self.keyring.token_key)

    @property
    def validator(self) -> Validator:
        """The Helm chart validator with this plane's settings (``plugins.control.helm``)."""
        from nvcf_mono.planes.control.charts import NoRenderer, validator_settings

        return Validator(self.charts or NoRenderer(), validator_settings(self.config.helm))

    @property
    def region(self) -> str:
        return self.config.region or self.settings.node.region

    @property
    def api_url(self) -> str:
        if self.config.api_url:
            return self.config.api_url.rstrip("/")
        if self._endpoints is None:
            raise ProblemError(503, "the control plane is starting", headers={"Retry-After": "1"})
        return self._endpoints.api_url.rstrip("/")

    @property
    def worker_grpc_address(self) -> str:
        if self.config.worker_grpc_address:
            return self.config.worker_grpc_address
        if self._endpoints is None:
            raise ProblemError(503, "the control plane is starting", headers={"Retry-After": "1"})
        return self._endpoints.grpc_address

    def poke(self) -> None:
        """Ask the reconciler to look again now."""
        self.wake.notify()
