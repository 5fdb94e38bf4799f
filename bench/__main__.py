"""Run every benchmark: ``python -m bench [--quick]``."""

from __future__ import annotations

import argparse
import shutil

import anyio

from bench import bus, cold_start, container_cold_start, image_pull, invoke, llm, models, versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args()
    anyio.run(bus.run, args.quick, backend="asyncio")
    for transport in ("grpc", "nats"):
        print(f"-- invocation, worker transport {transport}")
        anyio.run(invoke.run, args.quick, f"plugins.invocation.transport={transport}", backend="asyncio")
    print("-- the LLM gateway: streamed chat completions")
    anyio.run(llm.run, args.quick, backend="asyncio")
    print("-- cold start and scale to zero")
    anyio.run(cold_start.run, args.quick, backend="asyncio")
    if shutil.which("podman"):
        print("-- cold start on the containers backend (podman)")
        anyio.run(container_cold_start.run, args.quick, backend="asyncio")
        print("-- image pulls on the containers backend: the platform's against the engine's")
        anyio.run(image_pull.run, args.quick, backend="asyncio")
    else:
        print("-- cold start on the containers backend: skipped, podman is not installed")
    print("-- reading and writing the data models")
    anyio.run(models.run, args.quick, backend="asyncio")
    print("-- the cost of a function version")
    anyio.run(versions.run, args.quick, backend="asyncio")


if __name__ == "__main__":
    main()
