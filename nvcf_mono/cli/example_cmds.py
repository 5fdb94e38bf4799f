"""``nvcf-mono example NAME [ARGS...]``: serve one of the example functions (``nvcf_mono/examples``).

The platform's image has the examples inside, so it is their container image too: a function with
``containerImage: <the nvcf-mono image>`` and ``containerArgs: "example llm --host 0.0.0.0"`` runs the
OpenAI-compatible example model on the containers and Kubernetes backends, as ``image: llm`` does on
the local one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext

#: Name -> module of the examples that serve (the task example runs to completion instead).
EXAMPLES = {
    "echo": "nvcf_mono.examples.echo",
    "sse": "nvcf_mono.examples.sse",
    "llm": "nvcf_mono.examples.llm",
    "grpc-echo": "nvcf_mono.examples.grpc_echo",
    "task": "nvcf_mono.examples.task",
}


def register(sub: Any) -> None:
    """Add ``example``."""
    example = sub.add_parser(
        "example",
        help=help_of("example"),
        description="Run an example function's server (or the example task) in the foreground: echo, sse, llm "
        "(a tiny OpenAI-compatible model), grpc-echo, task. The arguments after NAME are the example's own "
        "(--port, --host; `nvcf-mono example llm --help`). The port defaults to $INFERENCE_PORT, $PORT or 8000.",
    )
    example.add_argument("name", choices=sorted(EXAMPLES), metavar="NAME", help=", ".join(sorted(EXAMPLES)))
    example.add_argument("args", nargs=argparse.REMAINDER, help="the example's own arguments")
    example.set_defaults(func=_example)


def _example(args: argparse.Namespace, ctx: CliContext) -> int:
    module = importlib.import_module(EXAMPLES[args.name])
    # The examples parse sys.argv themselves (they also run as `python -m nvcf_mono.examples.<name>`).
    sys.argv = [f"nvcf-mono example {args.name}", *args.args]
    result = module.main()
    return result if isinstance(result, int) else 0
