"""What the platform's own image pull costs against the engine pulling: ``python -m bench.image_pull``.

A real registry (Debian's ``docker-registry``) over https on 127.0.0.1 holds the LLM test image (the
example model server on this machine's Python, about 35 MB compressed). Each round, alternating: the
containers backend's pull (``image_pull.pull_archive``, then ``podman load`` of the archive, as the
engine API's ``/images/load`` does) against ``podman pull`` of the same image, each into an empty image
store of its own (``--root``), so neither finds a layer it already has. Then a new version of it (one
more layer of 1 MB) into the same stores: the platform's pull leaves out the layers the store has, as
the backend does on Podman, and the engine's pull skips them.
"""

from __future__ import annotations

import argparse
import json
import os
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


async def _new_version(podman: str, image: str, work: Path) -> str:
    """``image`` with a layer more (1 MB of random bytes), as a local image of its own."""
    context = work / "version-2"
    context.mkdir()
    (context / "added").write_bytes(os.urandom(1024 * 1024))
    (context / "Containerfile").write_text(f"FROM {image}\nCOPY added /added\n")
    await anyio.run_process([podman, "build", "-q", "-t", "localhost/bench/llm-version:2", str(context)])
    return "localhost/bench/llm-version:2"


async def _layers(podman: str, store: list[str], name: str) -> set[str]:
    found = await anyio.run_process([podman, *store, "image", "inspect", "--format", "{{json .RootFS.Layers}}", name])
    return set(json.loads(found.stdout))


def _medians(what: str, reads: list[float], loads: list[float], engine: list[float]) -> None:
    platform = [r + lo for r, lo in zip(reads, loads, strict=True)]
    print(f"  {what}: platform read {statistics.median(reads):.2f} s + engine load {statistics.median(loads):.2f} s")
    print(f"  = {statistics.median(platform):.2f} s; the engine's own pull {statistics.median(engine):.2f} s")
    ratios = [p / e for p, e in zip(platform, engine, strict=True)]
    print(f"  platform / engine: {statistics.median(ratios):.2f}x (per round: {', '.join(f'{r:.2f}' for r in ratios)})")


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
            ref, ref2 = f"{host}/bench/llm:1", f"{host}/bench/llm:2"
            login = ["--creds", "alice:wonderland"]
            push = [podman, "push", "--tls-verify=false", *login]
            await anyio.run_process([*push, image, f"docker://{ref}"])
            version = await _new_version(podman, image, work)
            await anyio.run_process([*push, version, f"docker://{ref2}"])
            await anyio.run_process([podman, "rmi", version])
            options = image_pull.PullOptions(
                ca_file=tls.ca, networks=("127.0.0.1/32",), networks_setting="-", max_size=10**11
            )
            credentials = [RegistryCredential(username="alice", password="wonderland")]
            reads, loads, engine = [], [], []
            again: tuple[list[float], list[float], list[float]] = ([], [], [])
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

                store = _store(work, f"p{n}")
                on_host = await _layers(podman, store, image_pull.local_name(image_pull.parse(ref)))
                started = time.monotonic()
                await image_pull.pull_archive(image_pull.parse(ref2), credentials, options, archive, on_host)
                read = time.monotonic()
                await anyio.run_process([podman, *store, "load", "-i", str(archive)])
                loaded = time.monotonic()
                archive.unlink()
                await anyio.run_process([podman, *_store(work, f"e{n}"), "pull", "--tls-verify=false", *login, ref2])
                pulled = time.monotonic()
                for figures, value in zip(again, (read - started, loaded - read, pulled - loaded), strict=True):
                    figures.append(value)
                for name in (f"p{n}", f"e{n}"):
                    await anyio.run_process([podman, *_store(work, name), "system", "reset", "-f"], check=False)
    print(f"image of {size / 1e6:.1f} MB (archive), {rounds} alternating rounds, medians:")
    _medians("into an empty store", reads, loads, engine)
    _medians("a new version (a 1 MB layer more)", *again)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    anyio.run(run, parser.parse_args().quick, backend="asyncio")


if __name__ == "__main__":
    main()
