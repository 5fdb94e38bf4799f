"""What every subcommand receives instead of reaching for globals (argv, env, signals live in __main__)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING

import attrs

from nvcf_mono.errors import NvcfMonoError

if TYPE_CHECKING:
    from nvcf_mono.host import Host
    from nvcf_mono.plugin import Endpoints
    from nvcf_mono.worker.main import Sidecar


class CliError(NvcfMonoError):
    """A failure to report as ``nvcf-mono: <line>`` per line, with exit ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen(kw_only=True)
class CliContext:
    """The process's environment, streams, and the signal-owning host runner."""

    environ: Mapping[str, str]
    stdout: IO[str]
    stderr: IO[str]
    run_host: Callable[[Host, Callable[[Endpoints], None]], int]
    #: Runs a worker until it drains (first SIGTERM) or is stopped (second); returns the exit code.
    run_worker: Callable[[Sidecar, bool], int] | None = None
    #: What a file argument of ``-`` reads (None: there is no standard input to read).
    stdin: IO[bytes] | None = None
    #: The arguments that read ``stdin``: one at most (a second ``-`` would silently get nothing).
    stdin_read_by: list[str] = attrs.field(factory=list, eq=False, repr=False)
