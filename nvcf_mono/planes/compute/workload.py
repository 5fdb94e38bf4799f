"""The user's workload as the contract describes it (``INFERENCE_CONTAINER_ENV``, ``containerArgs``),
read the same way by every backend. ValueError says what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from nvcf_mono.contracts import env, states, tenant_env
from nvcf_mono.contracts.messages import CreationMessage
from nvcf_mono.planes.compute.health import LaunchFailure


def container_environment(contract: Mapping[str, str]) -> dict[str, str]:
    """``containerEnvironment`` from ``INFERENCE_CONTAINER_ENV`` (JSON ``[{key, value}]``)."""
    raw = contract.get(env.INFERENCE_CONTAINER_ENV, "").strip()
    if not raw:
        return {}
    try:
        return {str(item["key"]): str(item["value"]) for item in json.loads(raw)}
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"INFERENCE_CONTAINER_ENV is not [{{key, value}}]: {err}") from err


def image_of(message: CreationMessage) -> str:
    """The container image the workload names ("" when it names none)."""
    launch = message.launch_specification
    return launch.container_image or launch.environment.get(env.INFERENCE_CONTAINER, "")


def container_args(text: str) -> list[str]:
    """``containerArgs`` split like a shell would."""
    return tenant_env.split_args(text)


def refused(contract: Mapping[str, str]) -> str | None:
    """What the platform's rule (``contracts/tenant_env.py``) refuses in a workload; None when it may run.

    The control plane refuses the same at the API; a version stored before the rule reaches agents anyway.
    """
    try:
        environment = container_environment(contract)
    except ValueError as err:
        return str(err)
    return tenant_env.workload_problem(environment.items(), contract.get(env.INFERENCE_CONTAINER_ARGS))


def refusal(message: CreationMessage) -> LaunchFailure | None:
    """A launch failure for a workload the rule refuses (every backend checks before it starts one)."""
    problem = refused(message.launch_specification.environment)
    if problem is None:
        return None
    return LaunchFailure(cause=states.CREATE_CONTAINER_ERROR, detail=f"{problem} (refused by the cluster's agent)")
