"""Example functions that ship with nvcf-mono; the default image catalog runs them.

Each is one small module, runnable on its own as ``python -m nvcf_mono.examples.<name> --port N``
(the port also comes from ``INFERENCE_PORT`` or ``PORT``, which the local backend sets per instance):

- :mod:`nvcf_mono.examples.echo`: HTTP echo (``POST /echo``), image ``echo``.
- :mod:`nvcf_mono.examples.sse`: a server-sent-events streamer (``POST /stream``), image ``sse``.
- :mod:`nvcf_mono.examples.llm`: a tiny OpenAI-compatible model (``/v1/chat/completions``, ...), image ``llm``.
- :mod:`nvcf_mono.examples.grpc_echo`: gRPC echo (``examples.echo.v1.EchoService``), image ``grpc-echo``.

Copy one to start your own function; ``examples/README.md`` in the repository walks through it.
"""

from __future__ import annotations

import argparse
import os

#: The largest request body the HTTP examples read: the platform's own default limit, so an example
#: takes whatever the platform passes on (aiohttp's default is 1 MiB).
MAX_BODY = 64 << 20


def arguments(description: str | None, port: int = 8000) -> argparse.ArgumentParser:
    """An example's command line: ``--port`` (``INFERENCE_PORT``, else ``PORT``, else ``port``) and ``--host``."""
    default = int(os.environ.get("INFERENCE_PORT") or os.environ.get("PORT") or port)  # noqa: TID251 - the instance contract
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=default, help=f"default: $INFERENCE_PORT, $PORT or {port}")
    parser.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (0.0.0.0 in a container)")
    return parser
