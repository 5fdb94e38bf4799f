"""Entry point of ``nvcf-mono``: the only place that reads argv and the environment and owns signals.

Kept light: the host and the worker are imported by the runner that needs them, so a command that
starts neither does not pay for them.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from nvcf_mono import heap
from nvcf_mono.cli import main as cli_main
from nvcf_mono.cli.context import CliContext
from nvcf_mono.errors import NvcfMonoError

if TYPE_CHECKING:
    from nvcf_mono.host import Host
    from nvcf_mono.plugin import Endpoints
    from nvcf_mono.worker.main import Sidecar

log = logging.getLogger("nvcf_mono")


class _OnReady:
    """A task_status that hands the host's endpoints to a callback."""

    def __init__(self, callback: Callable[[Endpoints], None]) -> None:
        self._callback = callback

    def started(self, value: Endpoints | None = None) -> None:
        if value is not None:
            heap.settle()  # what start-up built stays; serving collects less often
            self._callback(value)


async def _watch_signals(host: Host, scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        count = 0
        async for signum in signals:
            count += 1
            name = signal.Signals(signum).name
            if count == 1:
                log.info("%s received: draining (send it again to stop at once)", name)
                host.request_shutdown()
            else:
                log.warning("%s received again: stopping without waiting", name)
                scope.cancel()


async def _serve(host: Host, on_ready: Callable[[Endpoints], None]) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_signals, host, tg.cancel_scope, name="main:signals")
        try:
            await host.serve(task_status=_OnReady(on_ready))
        finally:
            tg.cancel_scope.cancel()


def _allow_many_open_files() -> None:
    """Raise the open-file limit to what the system allows the process.

    The soft limit is often 1024: a thousand idle client connections (one load test, or one tenant)
    would spend it, and then no one's connection is accepted. Servers raise it to the hard limit.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else _MOST_OPEN_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as err:
            log.warning("open files stay limited to %d (raising it to %d failed: %s)", soft, wanted, err)
            return
        log.debug("open files limit raised from %d to %d", soft, wanted)


#: Where the hard limit is unlimited: Linux's usual fs.nr_open.
_MOST_OPEN_FILES = 1 << 20


def run_host(host: Host, on_ready: Callable[[Endpoints], None]) -> int:
    """Serve until signalled; 0 after a clean stop, 1 when something failed."""
    from nvcf_mono.host import HostFailed

    _allow_many_open_files()
    try:
        anyio.run(_serve, host, on_ready, backend="asyncio")
    except HostFailed as err:
        log.error("stopped: %s", err)
        return 1
    except BaseExceptionGroup as group:
        for exc in group.exceptions:
            # The platform's own errors say what to do in their message: no traceback for them.
            log.error("stopped: %s", exc, exc_info=not isinstance(exc, NvcfMonoError))
        return 1
    return 0


async def _watch_worker_signals(worker: Sidecar, scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        count = 0
        async for signum in signals:
            count += 1
            if count == 1:
                log.info("%s received: draining (send it again to stop at once)", signal.Signals(signum).name)
                worker.request_drain()
            else:
                scope.cancel()


def run_worker(worker: Sidecar, secrets: bool) -> int:
    """Serve until drained (first signal) or stopped (second); 1 when the worker could not run."""
    from nvcf_mono.worker.main import run_worker as serve_worker

    heap.settle()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_worker_signals, worker, tg.cancel_scope, name="worker:signals")
            await serve_worker(worker, secrets=secrets)
            tg.cancel_scope.cancel()

    try:
        anyio.run(main, backend="asyncio")
    except (TimeoutError, OSError) as err:
        log.error("worker stopped: %s", err)
        return 1
    except BaseExceptionGroup as group:
        for exc in group.exceptions:
            # Not one of the conditions above: a fault, whose traceback is what finds it.
            log.error("worker stopped: %s", exc, exc_info=exc)
        return 1
    return 0


def main() -> None:
    """Console script ``nvcf-mono``."""
    ctx = CliContext(
        environ=dict(os.environ),
        stdout=sys.stdout,
        stderr=sys.stderr,
        run_host=run_host,
        run_worker=run_worker,
        stdin=sys.stdin.buffer if sys.stdin is not None else None,
    )
    try:
        code = cli_main(sys.argv[1:], ctx)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped reading (`| head`): not the command's fault, and no traceback. What is
        # still buffered has nowhere to go; stdout goes to /dev/null so the exit flush is silent too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + signal.SIGPIPE
    sys.exit(code)


if __name__ == "__main__":
    main()
