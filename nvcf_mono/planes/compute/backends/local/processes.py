"""Processes of local instances: started in their own session (a process group that a terminate
reaches whole, and that outlives an agent killed with SIGKILL), recognised again by pid + start time
(``/proc``), and found by the ``NVCF_CLUSTER_ID`` in their environment when no record names them.

These are blocking helpers; the backend calls the slow ones (spawning) in a worker thread.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from collections.abc import Container, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

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
    #: How it ended, in words, where its exit code cannot say (a start the container engine refused).
    ended_how: str = ""

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


@attrs.frozen
class RunAs:
    """Another user to run a process as (the agent is root), and the umask it starts with."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    umask: int


def open_log(path: Path) -> BinaryIO:
    """The agent's own log file, for appending: never through a link an instance planted, never another's file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{path} is not the agent's own log file: refusing to write to it")
    return os.fdopen(fd, "ab")


def spawn(
    role: str,
    *,
    argv: Sequence[str],
    environment: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    banner: str,
    run_as: RunAs | None = None,
    umask: int | None = None,
) -> Proc:
    """Start one process in a new session, output appended to ``log_path`` (blocking; raises OSError).
    ``umask``: its umask when it runs as this user (``run_as`` brings its own).
    """
    user: dict[str, Any] = {} if umask is None else {"umask": umask}
    if run_as is not None:
        # The working directory is entered before the user changes: it need not be reachable by path.
        user = {"user": run_as.uid, "group": run_as.gid, "extra_groups": list(run_as.groups), "umask": run_as.umask}
    with open_log(log_path) as out:
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
            **user,
        )
    return Proc(role=role, pid=popen.pid, ticks=start_ticks(popen.pid) or 0, started_at=now_iso(), popen=popen)


def exit_text(what: str, proc: Proc) -> str:
    """``<what> exited with code 1`` / ``<what> was killed by SIGKILL``."""
    if proc.ended_how:
        return f"{what} {proc.ended_how}"
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


def user_of(pid: int) -> int | None:
    """The (effective) uid ``pid`` runs as; None when it is gone."""
    try:
        return (PROC / str(pid)).stat().st_uid
    except OSError:
        return None


def belongs_to(pid: int, instance_id: str, users: Container[int] = frozenset()) -> bool:
    """The process at ``pid`` was started for ``instance_id``: its environment says so, or, where the
    environment cannot be read (another user's, without CAP_SYS_PTRACE), it runs as one of the instance's ``users``.
    """
    found = environment_of(pid)
    if found is None:
        if users:
            return user_of(pid) in users
        return not have_proc()  # nothing to check against: trust pid + start time
    return found.get(env.INSTANCE_ID) == instance_id


def cluster_processes(
    cluster_id: str, root: Path, owners: Mapping[int, str] | None = None
) -> Iterator[tuple[int, int, str]]:
    """``(pid, process group, instance id)`` of this cluster's instance processes whose files are under ``root``:
    this user's, and those of the instance users in ``owners`` (uid -> instance id).
    """
    # SECRETS_FILE says where an instance lives: another installation with the same cluster id is not touched.
    if not have_proc():
        return
    me = os.getuid()
    owners = owners or {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
        except OSError:
            continue
        if uid != me and uid not in owners:
            continue
        pid = int(entry.name)
        found = environment_of(pid)
        if found is None and uid in owners:
            # An instance user's process whose environment is closed to us: its uid names its instance.
            found = {env.NVCF_CLUSTER_ID: cluster_id, env.SECRETS_FILE: str(root), env.INSTANCE_ID: owners[uid]}
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


def users_running() -> set[int]:
    """The uids of every process on this machine (so a new instance never shares one)."""
    out: set[int] = set()
    if not have_proc():
        return out
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                out.add(entry.stat().st_uid)
            except OSError:
                continue
    return out


def kill_users(uids: Container[int]) -> None:
    """SIGKILL every process running as one of ``uids`` (an instance's, wherever it went: a daemon that left
    its process group too).
    """
    if not have_proc():
        return
    for _ in range(5):  # again while something was found: a child forked during the pass
        found = False
        for entry in PROC.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat().st_uid not in uids or start_ticks(int(entry.name)) is None:
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
                found = True
            except OSError:
                continue
        if not found:
            return


def kill_group(pid: int, signum: int) -> None:
    """Signal a process group, ignoring one that is gone."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def read_tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a file, as text ("" if it does not exist)."""
    try:
        # Never through a link: an instance's directory is the instance's to write in.
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(size - limit, 0))
            data = fh.read()
    except OSError:
        return ""
    return data.decode(errors="replace")
