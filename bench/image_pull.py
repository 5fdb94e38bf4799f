"""What the platform's own image pull costs against the engine pulling: ``python -m bench.image_pull``.

A real registry (Debian's ``docker-registry``) over https on 127.0.0.1 holds the LLM test image (the
example model server on this machine's Python, about 35 MB compressed). Each round, alternating: the
containers backend's pull (``image_pull.pull_archive``, then ``podman load`` of the archive, as the
engine API's ``/images/load`` does) against ``podman pull`` of the same image, each into an empty image
store of its own (``--root``), so neither finds a layer it already has.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from nvcf_mono.helm.model import RegistryCredential
from nvcf_mono.planes.compute.backends.containers import image_pull
from nvcf_mono.testing.container_images import build_llm_image, registry_server
from nvcf_mono.tls import development_certificate


def _store(work: Path, name: str) -> list[str]:
    return ["--root", str(work / name / "root"), "--runroot", str(work / name / "run")]


async def run(quick: bool) -> None:
    podman = shutil.which("podman")
    if podman is None or shutil.which("docker-registry") is None:
        print("image pulls: skipped, podman or docker-registry is not installed")
        return
    image = build_llm_image(podman)
    rounds = 2 if quick else 5
    with tempfile.TemporaryDirectory(prefix="nvcf-bench-pull-") as scratch:
        work = Path(scratch)
        tls = development_certificate(work / "tls", ["127.0.0.1"])
        with registry_server(work / "registry", tls=(tls.cert, tls.key)) as host:
            ref = f"{host}/bench/llm:1"
            login = ["--creds", "alice:wonderland"]
            push = [podman, "push", "--tls-verify=false", *login, image, f"docker://{ref}"]
            await anyio.run_process(push)
            options = image_pull.PullOptions(
                ca_file=tls.ca, networks=("127.0.0.1/32",), networks_setting="-", max_size=10**11
            )
            credentials = [RegistryCredential(username="alice", password="wonderland")]
            reads, loads, engine = [], [], []
            for n in range(rounds):
                archive = work / "image.tar"
                started = time.monotonic()
                await image_pull.pull_archive(image_pull.parse(ref), credentials, options, archive)
                read = time.monotonic()
                await anyio.run_process([podman, *_store(work, f"p{n}"), "load", "-i", str(archive)])
                loaded = time.monotonic()
                size = archive.stat().st_size
                archive.unlink()
                pull = [podman, *_store(work, f"e{n}"), "pull", "--tls-verify=false", *login, ref]
                await anyio.run_process(pull)
                pulled = time.monotonic()
                reads.append(read - started)
                loads.append(loaded - read)
                engine.append(pulled - loaded)
                for name in (f"p{n}", f"e{n}"):
                    await anyio.run_process([podman, *_store(work, name), "system", "reset", "-f"], check=False)
    platform = [r + lo for r, lo in zip(reads, loads, strict=True)]
    print(f"image of {size / 1e6:.1f} MB (archive), {rounds} alternating rounds, medians:")
    print(f"  platform: read {statistics.median(reads):.2f} s + engine load {statistics.median(loads):.2f} s")
    print(f"  = {statistics.median(platform):.2f} s; the engine's own pull {statistics.median(engine):.2f} s")
    ratios = [p / e for p, e in zip(platform, engine, strict=True)]
    print(f"  platform / engine: {statistics.median(ratios):.2f}x (per round: {', '.join(f'{r:.2f}' for r in ratios)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    anyio.run(run, parser.parse_args().quick, backend="asyncio")


if __name__ == "__main__":
    main()
