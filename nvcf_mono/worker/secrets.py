"""An instance's secrets and telemetry credentials, fetched from the platform with its worker token.

The worker fetches them before its server starts and again every ``secrets_refresh`` seconds, so a
secret replaced while the instance runs reaches it: the secrets file is rewritten, and a telemetry
endpoint's new secret goes to the worker's own exports at once. A cluster agent fetches them the same
way for what it does on an instance's behalf (the Kubernetes Secret, the instance's output sent to its
logs endpoint), with the token and address in the instance's contract.
"""

from __future__ import annotations

import json
import logging
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import anyio
import attrs
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

from nvcf_mono.backoff import Backoff
from nvcf_mono.contracts import env
from nvcf_mono.proto.gen.nvcf.worker.v1 import SecretsRequest, SecretsResponse
from nvcf_mono.state_dir import write_private
from nvcf_mono.tracing import OtlpTarget
from nvcf_mono.worker import endpoint

log = logging.getLogger("nvcf_mono.worker")
SECRETS_MODE = 0o640
FETCH_SECRETS = "/nvcf.worker.v1.WorkerService/FetchSecrets"


class Source(endpoint.Dial, Protocol):
    """Where and as whom to ask (a worker's config, or :class:`ContractSource`)."""

    @property
    def worker_token(self) -> str: ...


@attrs.frozen(kw_only=True)
class ContractSource:
    """:class:`Source` of an instance as its contract names it, for an agent asking on its behalf."""

    grpc_address: str
    worker_token: str
    grpc_tls: bool = False
    grpc_ca: str | None = None
    grpc_address_file: str | None = None

    @classmethod
    def of(cls, contract: Mapping[str, str]) -> ContractSource:
        return cls(
            grpc_address=contract.get(env.NVCF_FQDN_GRPC, ""),
            worker_token=contract.get(env.NVCF_WORKER_TOKEN, ""),
            grpc_tls=contract.get(env.NVCF_FQDN_GRPC_TLS, "false").lower() == "true",
            grpc_ca=contract.get(env.NVCF_FQDN_GRPC_CA) or None,
            grpc_address_file=contract.get(env.NVCF_FQDN_GRPC_FILE) or None,
        )


@attrs.frozen
class InstanceSecrets:
    """Name -> value; and ``NVCF_TELEMETRY_EXPORTS`` as it is now (None: no endpoint, or a platform that
    does not say: keep what the instance started with).
    """

    values: dict[str, object]
    telemetry_exports: str | None = None


async def fetch_secrets(source: Source) -> InstanceSecrets:
    """The instance's secrets from the platform (through the invocation plane)."""
    async with endpoint.channel(source) as channel:
        with anyio.fail_after(30):
            async with channel.request(FETCH_SECRETS, Cardinality.UNARY_UNARY, SecretsRequest, SecretsResponse) as call:
                await call.send_message(SecretsRequest(worker_token=source.worker_token), end=True)
                reply = await call.recv_message()
    assert reply is not None
    values: dict[str, object] = json.loads(reply.secrets_json or "{}")
    return InstanceSecrets(values, reply.telemetry_exports_json)


def renew_credentials(exports: Mapping[str, OtlpTarget], raw: str | None) -> list[str]:
    """Give each of ``exports`` the headers ``raw`` (``NVCF_TELEMETRY_EXPORTS`` now) names for its signal;
    the signals whose headers changed. Only credentials change this way: the endpoints are the version's.
    """
    from nvcf_mono.contracts.telemetry import exports_problem, targets

    if not raw or exports_problem(raw) is not None:
        return []
    changed = []
    for signal, now in targets(raw).items():
        target = exports.get(signal)
        if target is not None and target.url == now.url and target.credentials.renew(now.headers):
            changed.append(signal)
    return changed


def write_secrets(path: Path, values: Mapping[str, object]) -> None:
    """Replace the secrets file atomically (a reader sees the old file or the new one, never a part)."""
    data = json.dumps(values).encode()
    # Group-readable: on a root platform the server runs as another user of the instance's own group
    # (the instance directory keeps everyone else out). A file already there keeps its mode: the
    # containers backend opens it to whichever user the image runs as (0644, in a closed directory).
    try:
        mode = stat.S_IMODE(path.stat().st_mode) & 0o644
    except FileNotFoundError:
        mode = SECRETS_MODE
    write_private(path, data, mode=mode)
    log.info("wrote %d secrets to %s", len(values), path)


async def keep_secrets_current(
    source: Source,
    every: float,
    path: Path | None,
    written: Mapping[str, object] | None,
    exports: Mapping[str, OtlpTarget],
) -> None:
    """Fetch the secrets every ``every`` seconds: rewrite the file at ``path`` when they changed (``written``
    None: no file yet, made once there is a secret), and renew the credentials of ``exports``.

    A failed fetch (the platform restarting, say) keeps everything as it is and is tried again sooner.
    """
    backoff = Backoff(initial=min(1.0, every), maximum=every)
    delay = every
    while True:
        await anyio.sleep(delay)
        try:
            fetched = await fetch_secrets(source)
        except (OSError, TimeoutError, GRPCError, StreamTerminatedError) as err:
            delay = backoff.next()
            log.warning("could not fetch updated secrets (trying again in %.0fs): %s", delay, err)
            continue
        backoff.reset()
        delay = every
        if path is not None and fetched.values != written and (fetched.values or written is not None):
            write_secrets(path, fetched.values)
            written = fetched.values
        for signal in renew_credentials(exports, fetched.telemetry_exports):
            log.info("the %s telemetry endpoint's secret was replaced: sending with the new one", signal)
