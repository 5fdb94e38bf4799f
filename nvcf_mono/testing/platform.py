"""Run the platform inside a test: configs with short timers, an HTTP client, the credentials.

Each test that runs a control plane gets its own NATS (the embedded one, or a ``NatsServer`` shared
by the processes of that test): the control plane's buckets have fixed names, so tests sharing a
server would see each other's functions.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import attrs

from nvcf_mono.auth.secret import PlatformSecret
from nvcf_mono.config.load import ResolvedConfig
from nvcf_mono.host import Host
from nvcf_mono.state_dir import ENDPOINTS_FILE
from nvcf_mono.testing.host import config_for_test
from nvcf_mono.testing.openapi import ResponseChecker

#: Timers short enough for tests to see failures, retries and takeovers in seconds.
FAST = {
    "plugins.control.reconcile.interval": "0.5",
    "plugins.control.reconcile.lease_ttl": "3",
    "plugins.control.reconcile.retry_backoff": "0.2",
    "plugins.control.reconcile.retry_backoff_max": "1",
    "plugins.control.autoscaler.interval": "0.5",
    "plugins.control.cluster_heartbeat_ttl": "5",
    # No cluster agent unless a test configures one (most tests script their own agents on the bus).
    "plugins.compute.clusters": "[]",
    # No example function: tests count the functions they make.
    "plugins.control.example_function": "false",
    # Image `echo` is the test echo server (crash, health fail/recover, progress) rather than the example.
    "images.echo.command": '["{python}", "-m", "nvcf_mono.testing.echo_server", "--port", "{port}"]',
}


def platform_config(
    state_dir: Path,
    *,
    nats_url: str | None = None,
    role: str = "all-in-one",
    node: str | None = None,
    secret_file: Path | None = None,
    settings: Mapping[str, Any] | None = None,
    extra_plugins: Sequence[str] = (),
) -> ResolvedConfig:
    """A config for one platform process. ``secret_file`` is shared by processes of one platform."""
    values: dict[str, Any] = {"role": role, **FAST}
    if node is not None:
        values["node.id"] = node
    if secret_file is not None:
        if not secret_file.exists():
            PlatformSecret.generate().write(secret_file)
        values["plugins.auth.secret_file"] = str(secret_file)
    values.update(settings or {})
    return config_for_test(state_dir, nats_url=nats_url, settings=values, extra_plugins=extra_plugins)


def credentials(host: Host) -> dict[str, str]:
    """``endpoints.json`` credentials of a running host."""
    doc = json.loads((host.settings.state_dir / ENDPOINTS_FILE).read_text())
    return {k: v for k, v in doc["credentials"].items() if v}


@attrs.frozen
class Reply:
    """A response, read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def detail(self) -> str:
        doc = self.json
        return str(doc.get("detail", "")) if isinstance(doc, dict) else ""


class Api:
    """An HTTP client for one base URL and token; every call has a deadline."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base: str,
        token: str | None,
        *,
        timeout: float = 10.0,
        checker: ResponseChecker | None = None,
    ) -> None:
        self.session = session
        self.base = base.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.checker = checker

    def as_(self, token: str | None) -> Api:
        """The same client with another credential (None: no Authorization header)."""
        return Api(self.session, self.base, token, timeout=self.timeout, checker=self.checker)

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Reply:
        hdrs = dict(headers or {})
        if self.token is not None:
            hdrs.setdefault("Authorization", f"Bearer {self.token}")
        raw = data if data is not None else (None if body is None else json.dumps(body).encode())
        # aiohttp warns that bytes past a MiB are written in one piece: hand it a file instead.
        payload = io.BytesIO(raw) if raw is not None and len(raw) > 1024 * 1024 else raw
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        with anyio.fail_after(self.timeout):
            async with self.session.request(
                method, self.base + path, data=payload, headers=hdrs, params=params
            ) as resp:
                reply = Reply(status=resp.status, headers=dict(resp.headers), body=await resp.read())
        if self.checker is not None:
            content_type = reply.headers.get("Content-Type", "")
            is_json = "json" in content_type and reply.body
            self.checker.check(
                method, path.split("?", 1)[0], reply.status, content_type, reply.json if is_json else None
            )
        return reply

    async def get(self, path: str, **kw: Any) -> Reply:
        return await self.call("GET", path, **kw)

    async def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return await self.call("POST", path, body, **kw)

    async def put(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return await self.call("PUT", path, body, **kw)

    async def patch(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return await self.call("PATCH", path, body, **kw)

    async def delete(self, path: str, **kw: Any) -> Reply:
        return await self.call("DELETE", path, **kw)


async def wait_for(probe: Any, *, timeout: float = 15.0, interval: float = 0.05, what: str = "condition") -> Any:
    """Await ``probe()`` until it returns something truthy; fail after ``timeout``."""
    last: Any = None
    try:
        with anyio.fail_after(timeout):
            while True:
                last = await probe()
                if last:
                    return last
                await anyio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})") from None


async def deployment(api: Api, path: str) -> dict[str, Any]:
    """The deployment at ``path`` (``/v2/nvcf/deployments/functions/<id>/versions/<id>``)."""
    reply = await api.get(path)
    assert reply.status == 200, reply.body
    found: dict[str, Any] = reply.json["deployment"]
    return found


async def wait_status(api: Api, path: str, status: str, timeout: float = 30.0) -> dict[str, Any]:
    """The deployment at ``path`` once its function has ``status``."""

    async def probe() -> dict[str, Any] | None:
        dep = await deployment(api, path)
        return dep if dep["functionStatus"] == status else None

    found: dict[str, Any] = await wait_for(probe, timeout=timeout, what=f"function status {status}")
    return found
