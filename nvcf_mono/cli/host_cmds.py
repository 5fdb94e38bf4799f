"""``nvcf-mono up`` and ``nvcf-mono run``: start a host and serve until signalled."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.common import add_config_options, load_or_fail, sources_from
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.state_dir import ENDPOINTS_FILE

if TYPE_CHECKING:
    from nvcf_mono.plugin import Endpoints


def register(sub: Any) -> None:
    """Add the host commands."""
    up = sub.add_parser(
        "up",
        help=help_of("up"),
        description="Start the all-in-one platform: every plane in one process, on the embedded "
        "NATS unless bus.url is set. Ctrl-C (SIGTERM) drains and stops; a second one "
        "stops at once.",
    )
    add_config_options(up, role=False)
    up.add_argument(
        "--tls",
        action="store_true",
        help="serve HTTPS and gRPC over TLS with a development CA made under <state-dir>/tls (kept across "
        "restarts; clients trust tls/ca.pem, which endpoints.json names). Same as --set tls.self_signed=true",
    )
    up.set_defaults(func=_up)
    run = sub.add_parser(
        "run",
        help=help_of("run"),
        description="Run the role (and plugins) the configuration names.",
    )
    add_config_options(run)
    run.set_defaults(func=_run)


def _up(args: argparse.Namespace, ctx: CliContext) -> int:
    return _serve(args, ctx, forced_role="all-in-one")


def _run(args: argparse.Namespace, ctx: CliContext) -> int:
    return _serve(args, ctx, forced_role=None)


def _serve(args: argparse.Namespace, ctx: CliContext, *, forced_role: str | None) -> int:
    # The host brings the planes, the bus and the servers: imported only when one is started.
    from nvcf_mono.contracts.example import NAME as EXAMPLE_NAME
    from nvcf_mono.contracts.example import invoke_lines, read_marker
    from nvcf_mono.host import Host, HostSetupError
    from nvcf_mono.log import configure_logging

    config = load_or_fail(sources_from(args, ctx, forced_role=forced_role))
    configure_logging(config.settings.logging, stream=ctx.stderr)
    try:
        host = Host(config)
    except HostSetupError as err:
        raise CliError("\n".join(err.problems)) from err
    endpoints_file = config.settings.state_dir / ENDPOINTS_FILE

    control = config.plugins.get("control")
    console = "control" in config.order and control is not None and bool(getattr(control.config, "console", False))
    invocation = config.plugins.get("invocation")
    gateway = getattr(getattr(invocation.config, "llm_gateway", None), "enabled", False) if invocation else False
    llm = "invocation" in config.order and bool(gateway)

    def banner(ep: Endpoints) -> None:
        nats = ep.nats_url
        if host.embedded is not None:
            nats = nats.split("@", 1)[-1] if "@" in nats else nats
            nats = f"nats://{nats.removeprefix('nats://')} (embedded, store {config.settings.state_dir}/nats)"
        lines = [
            f"nvcf-mono is ready: role {config.settings.role}, plugins {', '.join(config.order) or 'none'}",
            f"  API         {ep.api_url or 'not on this node (peers.api_url says where)'}",
            f"  invocation  {ep.invocation_url or 'not on this node (peers.invocation_url says where)'}",
            f"  gRPC        {ep.invocation_grpc_address or ep.grpc_address}",
            *([f"  this node   {ep.url}"] if ep.url not in (ep.api_url, ep.invocation_url) else []),
            f"  NATS        {nats}",
            f"  endpoints   {endpoints_file}",
            *([f"  console     {ep.url.rstrip('/')}/console (sign in with a key or the token)"] if console else []),
            *([f"  LLM gateway {ep.url.rstrip('/')}/v1 (OpenAI's API: base_url for its clients)"] if llm else []),
            *([f"  TLS         HTTPS and gRPC; clients trust {ep.ca_file or 'the system CAs'}"] if ep.tls else []),
            *example_lines(ep),
            "Ctrl-C drains and stops.",
        ]
        print("\n".join(lines), file=ctx.stdout, flush=True)

    def example_lines(ep: Endpoints) -> list[str]:
        """How to invoke the example function, when this platform made one and it was not deleted."""
        if "control" not in config.order or ep.invocation_url is None:
            return []
        marker = read_marker(config.settings.state_dir / "plugins" / "control")
        if marker is None or marker.state == "removed":
            return []
        when = "deployed" if marker.state == "deployed" else "being deployed; the log says when it is ACTIVE"
        head = f"Example function {EXAMPLE_NAME} {marker.function_id} ({when}); invoke it:"
        return [
            head,
            *invoke_lines(marker.function_id, ep.invocation_url, config.settings.state_dir, endpoints_file, ep.ca_file),
        ]

    return ctx.run_host(host, banner)
