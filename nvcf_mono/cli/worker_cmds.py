"""``nvcf-mono worker``: the sidecar that serves one instance's inference server."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError


def register(sub: Any) -> None:
    """Add the worker command."""
    worker = sub.add_parser(
        "worker",
        help=help_of("worker"),
        description="Run beside an inference server: wait until it is healthy, connect to the invocation "
        "plane (NVCF_FQDN_GRPC) with the instance's worker token (NVCF_WORKER_TOKEN), and serve requests. "
        "Every setting comes from the instance environment contract (see nvcf_mono/contracts/README.md). "
        "SIGTERM drains; a second one stops at once.",
    )
    worker.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO")
    worker.add_argument("--log-format", choices=("text", "json"), default="text", help="json for log collectors")
    worker.set_defaults(func=_worker)


def _worker(args: argparse.Namespace, ctx: CliContext) -> int:
    # The worker brings the bus, gRPC and HTTP clients: imported only when it runs.
    from nvcf_mono.config.model import LoggingSettings
    from nvcf_mono.log import configure_logging
    from nvcf_mono.worker.config import WorkerConfigError
    from nvcf_mono.worker.main import build

    configure_logging(LoggingSettings(level=args.log_level, format=args.log_format), stream=ctx.stderr)
    try:
        worker, secrets = build(dict(ctx.environ))
    except WorkerConfigError as err:
        raise CliError("\n".join(f"worker: {line}" for line in str(err).splitlines())) from err
    if ctx.run_worker is None:
        raise CliError("this program cannot run a worker here", code=1)
    logging.getLogger("nvcf_mono.worker").info("worker for instance %s", worker.config.instance_id)
    return ctx.run_worker(worker, secrets)
