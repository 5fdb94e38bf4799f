"""Run a host inside a test body: ``async with running_host(config) as host:``.

Never start a host across a pytest fixture ``yield``: anyio cancel scopes must be entered and left in
the same task, which pytest-asyncio does not guarantee for fixtures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from nvcf_mono.config.load import ConfigSources, ResolvedConfig, load_config
from nvcf_mono.host import Host


def config_for_test(
    state_dir: Path,
    *,
    nats_url: str | None = None,
    settings: Mapping[str, Any] | None = None,
    extra_plugins: Sequence[str] = (),
    files: Sequence[Path] = (),
) -> ResolvedConfig:
    """A config for tests: free HTTP/gRPC ports, fast retries and grace periods, the given bus.

    ``settings`` maps dotted keys to values (``{"role": "custom", "plugins.x.enabled": "true"}``);
    they are applied like ``--set`` flags, after these test defaults.
    """
    defaults: dict[str, Any] = {
        "state_dir": str(state_dir),
        "http.port": "0",
        "grpc.port": "0",
        "embedded_nats.port": "0",
        "startup.retry_initial": "0.05",
        "startup.retry_max": "0.2",
        "startup.timeout": "20",
        "shutdown.drain_grace": "2",
        "shutdown.plugin_grace": "2",
        "bus.connect_retry_for": "10",
    }
    if nats_url is not None:
        defaults["bus.url"] = nats_url
    if extra_plugins:
        defaults["extra_plugins"] = "[" + ", ".join(extra_plugins) + "]"
    defaults.update(settings or {})
    overrides = tuple((key, str(value), f"test {key}") for key, value in defaults.items())
    return load_config(ConfigSources(files=tuple(files), environ={}, overrides=overrides))


@asynccontextmanager
async def running_host(config: ResolvedConfig, *, start_timeout: float = 30.0) -> AsyncIterator[Host]:
    """Start a host, wait until it is ready, yield it, and shut it down (draining) on exit."""
    host = Host(config)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(start_timeout):
            await tg.start(host.serve)
        try:
            yield host
        finally:
            host.request_shutdown()
