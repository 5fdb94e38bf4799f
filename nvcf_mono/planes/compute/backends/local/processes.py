"""Processes of local instances: started in their own session (a process group that a terminate
reaches whole, and that outlives an agent killed with SIGKILL), recognised again by pid + start time
(``/proc``), and found by the ``NVCF_CLUSTER_ID`` in their environment when no record names them.

These are blocking helpers; the backend calls the slow ones (spawning) in a worker thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from nvcf_mono.contracts import env
from nvcf_mono.models.common import now_iso

PROC = Path("/proc")


def have_proc() -> bool:
    """True where ``/proc/<pid>/stat`` exists (Linux): process identity can be checked."""
    return (PROC / "self" / "stat").exists()


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks after boot; None when it is gone or a zombie, 0 without /proc."""
    if not have_proc():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    # The command name may hold spaces or parentheses: the fields follow the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])


def environment_of(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` was started with (same user only); None when unreadable."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


@attrs.define(eq=False)
class Proc:
    """One process of an instance: a child of this agent (``popen``), or one taken over after a restart."""

    role: str
    pid: int
    ticks: int
    started_at: str
    popen: subprocess.Popen[bytes] | None = None
    #: Exit status once known (None: running, or gone with an unknown status).
    returncode: int | None = None
    ended: bool = False

    def poll(self) -> bool:
        """True while it runs; records the exit once."""
        if self.ended:
            return False
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return True
            self.returncode = code
        elif self.is_same():
            return True
        else:
            self.returncode = None  # not our child: its exit status cannot be known
        self.ended = True
        return False

    def signal_group(self, signum: int) -> bool:
        """Signal its process group (it leads its own session); False when nothing was there."""
        if self.popen is None and not self.ended and not self.is_same():
            return False  # the pid now belongs to someone else: never signal it
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def detach(self) -> None:
        """Leave the process running for the next agent, and drop our handle on it quietly."""
        if self.popen is not None and self.popen.returncode is None:
            # Popen would warn that its child still runs, and keep it for reaping: it is not ours any more.
            self.popen._child_created = False  # type: ignore[attr-defined]
        self.popen = None

    def is_same(self) -> bool:
        ticks = start_ticks(self.pid)
        return ticks is not None and self.ticks in (0, ticks)


def spawn(
    role: str, *, argv: Sequence[str], environment: Mapping[str, str], cwd: Path, log_path: Path, banner: str
) -> Proc:
    """Start one process in a new session, output appended to ``log_path`` (blocking; raises OSError)."""
    with log_path.open("ab") as out:
        out.write(f"--- {now_iso()} nvcf-mono: {banner}\n".encode())
        out.flush()
        popen = subprocess.Popen(
            list(argv),
            env=dict(environment),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return Proc(role=role, pid=popen.pid, ticks=start_ticks(popen.pid) or 0, started_at=now_iso(), popen=popen)


def exit_text(role: str, proc: Proc) -> str:
    """``the inference server exited with code 1`` / ``... was killed by signal 9``."""
    what = "the inference server" if role == "inference" else "the worker"
    code = proc.returncode
    if code is None:
        return f"{what} is gone (it ended while the agent was not watching)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"{what} was killed by {name}"
    return f"{what} exited with code {code}"


def belongs_to(pid: int, instance_id: str) -> bool:
    """The process at ``pid`` was started for ``instance_id`` (its environment says so)."""
    found = environment_of(pid)
    if found is None:
        return not have_proc()  # nothing to check against: trust pid + start time
    return found.get(env.INSTANCE_ID) == instance_id


def cluster_processes(cluster_id: str, root: Path) -> Iterator[tuple[int, int, str]]:
    """``(pid, process group, instance id)`` of this cluster's instance processes whose files are under ``root``."""
    # SECRETS_FILE says where an instance lives: another installation with the same cluster id is not touched.
    if not have_proc():
        return
    me = os.getuid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != me:
                continue
        except OSError:
            continue
        pid = int(entry.name)
        found = environment_of(pid)
        if found is None or found.get(env.NVCF_CLUSTER_ID) != cluster_id:
            continue
        if not Path(found.get(env.SECRETS_FILE, "/")).is_relative_to(root):
            continue
        if start_ticks(pid) is None:
            continue
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        yield pid, group, found.get(env.INSTANCE_ID, "")


def kill_group(pid: int, signum: int) -> None:
    """Signal a process group, ignoring one that is gone."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def read_tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a file, as text ("" if it does not exist)."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(size - limit, 0))
            data = fh.read()
    except OSError:
        return ""
    return data.decode(errors="replace")
