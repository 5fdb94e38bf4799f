"""The environments of a local instance's two processes (the contract of ``contracts/env.py``).

The worker gets the whole contract the creation message carries, pointed at the instance's real
ports and directories; the inference server gets its image's and the function's variables plus
NVCF's pod fields, and never the worker token.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from nvcf_mono.contracts import env, states
from nvcf_mono.planes.compute import workload
from nvcf_mono.planes.compute.backends.local.images import LaunchError

_CONTRACT = frozenset(v.name for v in env.CONTRACT) - {env.CUDA_VISIBLE_DEVICES, env.PORT}
SECRETS_NAME = "secrets.json"
#: The platform's current WorkerService address, kept by the backend, read by the worker.
ADDRESS_FILE = "grpc-address"


def host_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What instance processes inherit from the host: not nvcf-mono's settings, nor another instance's contract."""
    return {k: v for k, v in environ.items() if not k.startswith("NVCF_MONO__") and k not in _CONTRACT}


@attrs.frozen(kw_only=True)
class Where:
    """The local facts of one instance."""

    instance_id: str
    cluster_id: str
    port: int
    health_port: int
    directory: Path
    devices: tuple[int, ...]
    ready_timeout: float
    health_interval: float
    secrets_refresh: float = 10.0
    #: The operator's proxy to the workload's telemetry endpoints.
    telemetry_proxy: str | None = None

    @property
    def secrets_file(self) -> Path:
        return self.directory / SECRETS_NAME


def worker_environment(base: Mapping[str, str], contract: Mapping[str, str], where: Where) -> dict[str, str]:
    """The sidecar's environment: the contract, with the instance's own ports and directories."""
    out = {**base, **contract}
    for key in (env.CONTAINER_REGISTRIES_CREDENTIALS, env.HELM_REGISTRIES_CREDENTIALS):
        out.pop(key, None)  # processes pull nothing: no process needs them
    declared = contract.get(env.INFERENCE_PORT, "")
    health = contract.get(env.INFERENCE_HEALTH_PORT, declared)
    out.update(
        {
            env.INFERENCE_PORT: str(where.port),
            # A health check on the serving port follows it; one on another port cannot be moved.
            env.INFERENCE_HEALTH_PORT: str(where.port) if health in ("", declared) else health,
            env.INFERENCE_HOST: "127.0.0.1",
            env.HEALTH_PORT: str(where.health_port),
            env.INSTANCE_ID: where.instance_id,
            env.NVCF_INSTANCE_ID: where.instance_id,
            env.NVCF_CLUSTER_ID: where.cluster_id,
            env.INFERENCE_READY_TIMEOUT: f"{where.ready_timeout:g}",
            env.WORKER_HEALTH_INTERVAL: f"{where.health_interval:g}",
            env.BASE_ASSET_DIR: str(where.directory / "assets"),
            env.BASE_RESPONSE_DIR: str(where.directory / "responses"),
            # The server sees them where the worker does (the containers backend mounts them elsewhere).
            env.INFERENCE_ASSET_DIR: str(where.directory / "assets"),
            env.INFERENCE_RESPONSE_DIR: str(where.directory / "responses"),
            env.SECRETS_FILE: str(where.secrets_file),
            env.SECRETS_REFRESH_INTERVAL: f"{where.secrets_refresh:g}",
            env.NVCF_FQDN_GRPC_FILE: str(where.directory / ADDRESS_FILE),
        }
    )
    if where.telemetry_proxy:
        out[env.NVCF_TELEMETRY_PROXY] = where.telemetry_proxy
    return out


def container_environment(contract: Mapping[str, str]) -> dict[str, str]:
    """``containerEnvironment`` from ``INFERENCE_CONTAINER_ENV`` (JSON ``[{key, value}]``), refused whole when
    the platform's rule refuses a variable (``contracts/tenant_env.py``; the API refuses it too).
    """
    problem = workload.refused(contract)
    if problem is not None:
        raise LaunchError(states.CREATE_CONTAINER_ERROR, problem)
    return workload.container_environment(contract)


def inference_environment(
    base: Mapping[str, str], contract: Mapping[str, str], image_env: Mapping[str, str], where: Where
) -> dict[str, str]:
    """The inference server's environment: image env < containerEnvironment < what the agent sets."""
    out = {**base, **image_env, **container_environment(contract)}
    out.update(
        {
            env.INFERENCE_PORT: str(where.port),
            env.PORT: str(where.port),
            env.INSTANCE_ID: where.instance_id,
            env.NVCF_INSTANCE_ID: where.instance_id,
            env.NVCF_CLUSTER_ID: where.cluster_id,
            env.SECRETS_FILE: str(where.secrets_file),
            env.CUDA_VISIBLE_DEVICES: ",".join(str(d) for d in where.devices),
            env.NVCF_REGION: contract.get(env.REGION, ""),
            env.NVCF_INSTANCETYPE: contract.get(env.INSTANCE_TYPE, ""),
            env.NVCF_INSTANCETYPE_VALUE: contract.get(env.INSTANCE_TYPE, "").rsplit("_", 1)[0],
            env.NVCF_BACKEND: contract.get(env.BACKEND, ""),
            env.NVCF_ENV: env.PLATFORM_ENV,
            env.NVCF_NCA_ID: contract.get(env.NCA_ID, ""),
            env.NVCF_FUNCTION_ID: contract.get(env.FUNCTION_ID, ""),
            env.NVCF_FUNCTION_VERSION_ID: contract.get(env.FUNCTION_VERSION_ID, ""),
            env.NVCF_FUNCTION_NAME: contract.get(env.FUNCTION_NAME, ""),
        }
    )
    out.pop(env.NVCF_WORKER_TOKEN, None)
    return out
