"""The containers backend for real: Podman (``podman system service``, started by the backend) runs the
functions' images. CI installs podman, runc and busybox-static (``.ci/run``) and sets
NVCF_MONO_REQUIRE_CONTAINERS, so these tests run there; elsewhere they are skipped where podman is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvcf_mono.testing.container_images import build_echo_image, build_llm_image, write_containers_conf


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The podman binary, configured for this machine (CONTAINERS_CONF), with the test images built."""
    found = shutil.which("podman")
    if found is None:
        if os.environ.get("NVCF_MONO_REQUIRE_CONTAINERS"):
            pytest.fail("podman is not installed, and NVCF_MONO_REQUIRE_CONTAINERS says these tests must run")
        pytest.skip("podman is not installed (apt-get install podman runc busybox-static)")
    previous = os.environ.get("CONTAINERS_CONF")
    if previous is None:
        conf = write_containers_conf(tmp_path_factory.mktemp("podman") / "containers.conf")
        os.environ["CONTAINERS_CONF"] = str(conf)
    try:
        build_echo_image(found)
        yield found
    finally:
        if previous is None:
            os.environ.pop("CONTAINERS_CONF", None)


@pytest.fixture(scope="session")
def llm_image(podman: str) -> str:
    """The example model server as an image made of this machine's Python (built once per session)."""
    return build_llm_image(podman)


def containers_of(podman: str, cluster_id: str) -> list[str]:
    """Names of the cluster's containers, running or not (podman ps --filter label=...)."""
    out = subprocess.run(
        [
            podman,
            "ps",
            "-a",
            "--filter",
            f"label=nvca.nvcf.nvidia.io/cluster-id={cluster_id}",
            "--format",
            "{{.Names}}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(out.split())


def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"
