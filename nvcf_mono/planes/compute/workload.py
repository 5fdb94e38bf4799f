"""The user's workload as the contract describes it (``INFERENCE_CONTAINER_ENV``, ``containerArgs``),
read the same way by every backend. ValueError says what is wrong.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

from nvcf_mono.contracts import env


def container_environment(contract: Mapping[str, str]) -> dict[str, str]:
    """``containerEnvironment`` from ``INFERENCE_CONTAINER_ENV`` (JSON ``[{key, value}]``)."""
    raw = contract.get(env.INFERENCE_CONTAINER_ENV, "").strip()
    if not raw:
        return {}
    try:
        return {str(item["key"]): str(item["value"]) for item in json.loads(raw)}
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"INFERENCE_CONTAINER_ENV is not [{{key, value}}]: {err}") from err


def container_args(text: str) -> list[str]:
    """``containerArgs`` split like a shell would."""
    try:
        return shlex.split(text)
    except ValueError as err:
        raise ValueError(f"containerArgs cannot be split: {err}") from err
