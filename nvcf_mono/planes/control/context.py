"""What the control plane's handlers share: config, and the store, keys and bus once it runs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TypeVar, final

import anyio
import attrs

from nvcf_mono.account_uploads import AccountUploads
from nvcf_mono.auth.delegation import DelegationTokens
from nvcf_mono.auth.keystore import ApiKeyStore
from nvcf_mono.auth.secret import Keyring
from nvcf_mono.auth.tokens import TokenSigner
from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.mirror import Signal
from nvcf_mono.config.model import Settings
from nvcf_mono.contracts import env
from nvcf_mono.helm.service import ChartRenderer
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.late import Late
from nvcf_mono.planes.control.config import ControlConfig
from nvcf_mono.planes.control.store import ControlStore
from nvcf_mono.planes.control.traffic import TrafficHistory
from nvcf_mono.plugin import Endpoints
from nvcf_mono.reval.engine import Validator
from nvcf_mono.reval.objects import ExtraType

T = TypeVar("T")


@attrs.frozen
class ControlParts:
    """What the handlers need that exists only once the plugin runs."""

    store: ControlStore
    bus: Bus
    keyring: Keyring
    keys: ApiKeyStore | None
    endpoints: Endpoints
    #: Renders Helm charts (the ``helm`` plugin's); None where that plugin is not enabled.
    charts: ChartRenderer | None = None
    #: Kinds charts may contain besides the built-in ones (MiniService extensions).
    chart_types: tuple[ExtraType, ...] = ()
    #: Mints delegation tokens (the ``auth_delegation`` plugin's); None where that plugin is not enabled.
    delegation: DelegationTokens | None = None


@final
@attrs.define
class Control:
    """What the API handlers share; ``parts`` is set when the plugin runs (routes answer 503 before)."""

    config: ControlConfig
    settings: Settings
    log: logging.Logger
    wake: Signal = attrs.field(factory=Signal)
    #: The last hour of traffic per version (fed by the autoscaler's load report listener).
    traffic: TrafficHistory = attrs.field(factory=TrafficHistory)
    parts: Late[ControlParts] = attrs.field(factory=lambda: Late[ControlParts]("the control plane"))
    #: Asset uploads under way on this node, per account (held to the account's quota together).
    asset_uploads: AccountUploads = attrs.field(factory=AccountUploads)
    #: Held from counting an account's records to making one more (functions, versions, assets, tasks, API
    #: keys, registry credentials), so that requests at once are counted in turn and cannot pass a limit together.
    counted_creation: anyio.Lock = attrs.field(factory=anyio.Lock)

    @property
    def store(self) -> ControlStore:
        return self.parts.get().store

    @property
    def bus(self) -> Bus:
        return self.parts.get().bus

    @property
    def keyring(self) -> Keyring:
        return self.parts.get().keyring

    @property
    def keys(self) -> ApiKeyStore:
        return _enabled(self.parts.get().keys, "API keys", "auth_api_key")

    @property
    def delegation(self) -> DelegationTokens:
        return _enabled(self.parts.get().delegation, "delegation tokens", "auth_delegation")

    @property
    def charts(self) -> ChartRenderer | None:
        return self.parts.get().charts

    @property
    def tokens(self) -> TokenSigner:
        return TokenSigner(self.keyring.token_key)

    @property
    def validator(self) -> Validator:
        """The Helm chart validator with this plane's settings (``plugins.control.helm``)."""
        from nvcf_mono.planes.control.charts import NoRenderer, validator_settings

        charts = self.charts
        settings = validator_settings(self.config.helm, self.parts.get().chart_types)
        return Validator(charts or NoRenderer(), settings, images=charts)

    @property
    def region(self) -> str:
        return self.config.region or self.settings.node.region

    @property
    def api_url(self) -> str:
        if self.config.api_url:
            return self.config.api_url.rstrip("/")
        return self.parts.get().endpoints.url.rstrip("/")

    @property
    def worker_grpc_address(self) -> str:
        if self.config.worker_grpc_address:
            return self.config.worker_grpc_address
        endpoints = self.parts.get().endpoints
        # The invocation nodes' port (peers.invocation_grpc_address in a split), else this node's.
        return endpoints.invocation_grpc_address or endpoints.grpc_address

    @property
    def worker_link(self) -> dict[str, str]:
        """How instances dial the WorkerService (environment contract): its address, and whether over TLS
        trusting what; where their workers send spans when the platform traces.
        """
        own = not self.config.worker_grpc_address
        endpoints = self.parts.get().endpoints
        tls = self.config.worker_grpc_tls if self.config.worker_grpc_tls is not None else own and endpoints.tls
        link = {env.NVCF_FQDN_GRPC: self.worker_grpc_address, env.NVCF_FQDN_GRPC_TLS: "true" if tls else "false"}
        ca = self.config.worker_grpc_ca_file or (Path(endpoints.ca_file) if own and endpoints.ca_file else None)
        if tls and ca is not None:
            link[env.NVCF_FQDN_GRPC_CA] = ca.read_text()
        if self.settings.tracing.otlp_endpoint:
            link[env.NVCF_TRACES_ENDPOINT] = self.settings.tracing.otlp_endpoint  # workers trace there too
        return link

    def poke(self) -> None:
        """Ask the reconciler to look again now."""
        self.wake.notify()


def _enabled(service: T | None, what: str, plugin: str) -> T:
    """A service another plugin provides, or a 503 saying which plugin is off on this node."""
    if service is None:
        raise ProblemError(503, f"{what} are not enabled on this node (plugin {plugin})")
    return service
