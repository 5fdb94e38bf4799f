"""Who runs a local instance's processes, and who may enter its directory.

When nvcf-mono runs as root (``plugins.compute.local.run_as: auto`` or ``instance-users``), every
instance gets two users of its own from a configured range of uids (a uid needs no ``/etc/passwd``
entry): its server (or task) runs as one, its worker as the other, both with the instance's own group
and no other group but the range's shared one. No two instances share a uid, and no instance shares
one with the platform or with the worker that holds its token, so a function process cannot read the
state directory, another instance's directory, or its worker's environment (``/proc/<pid>/environ``).

The instance directory is the agent's (``root:<instance group>``, mode ``1770``): both processes may
create files there, neither may remove the other's or the agent's (its logs, mode 0600). ``assets``
and ``responses`` belong to the worker (the server reads them), ``results`` to the server (the worker
reads them), and the worker writes ``secrets.json`` readable by the group only. Processes start with
umask ``007``, so what one writes the other may read. When the instance is released, its processes of
either uid are killed (a daemon that left its process group too) and its directory closes (``0700``,
the agent's group), so a later instance given the same uids finds nothing of it.

Otherwise (not root, or ``run_as: platform-user``) instances run as the platform's own user, and the
backend warns once at start: a function process can then read everything the platform can.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import logging
import os
import random
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

import nvcf_mono
from nvcf_mono.contracts import states
from nvcf_mono.planes.compute.backends.local import processes, reach
from nvcf_mono.planes.compute.backends.local.images import LaunchError
from nvcf_mono.planes.compute.backends.local.processes import RunAs
from nvcf_mono.planes.compute.config import LocalSettings

#: Both processes of an instance may read what the other writes; nobody else may.
UMASK = 0o007
#: The instance directory: the agent's, both processes' to write in, each file removable by its owner only.
DIRECTORY_MODE = 0o1770
PROBE_TIMEOUT = 60.0


@attrs.frozen
class Slot:
    """The two users of one instance."""

    index: int
    server: RunAs
    worker: RunAs

    @property
    def gid(self) -> int:
        return self.server.gid

    @property
    def uids(self) -> frozenset[int]:
        return frozenset({self.server.uid, self.worker.uid})


@attrs.frozen
class UidRange:
    """``first`` is the group every instance process is in; then two uids per instance, the first of
    which is also the instance's group.
    """

    first: int
    count: int
    #: Further groups of every instance process (a GPU device group).
    extra: tuple[int, ...] = ()

    @property
    def shared_gid(self) -> int:
        return self.first

    @property
    def slots(self) -> int:
        return (self.count - 1) // 2

    def slot(self, index: int) -> Slot:
        server = self.first + 1 + 2 * index
        groups = (self.shared_gid, *self.extra)
        return Slot(
            index=index,
            server=RunAs(uid=server, gid=server, groups=groups, umask=UMASK),
            worker=RunAs(uid=server + 1, gid=server, groups=groups, umask=UMASK),
        )

    def slot_of_uid(self, uid: int) -> Slot | None:
        index, _ = divmod(uid - self.first - 1, 2)
        return self.slot(index) if uid > self.first and index < self.slots else None

    def slot_of_gid(self, gid: int) -> Slot | None:
        slot = self.slot_of_uid(gid)
        return slot if slot is not None and slot.gid == gid else None


def runtime_paths(worker_argv: Sequence[str]) -> list[Path]:
    """What every instance process must reach: this Python, its library, its packages (nvcf_mono among them)."""
    found = [
        Path(sys.executable),
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
        Path(sys.base_exec_prefix),
        Path(nvcf_mono.__file__).parent,
        *(Path(p) for p in sys.path if p),
    ]
    if worker_argv and os.sep in worker_argv[0]:
        found.append(Path(worker_argv[0]))
    return [p for p in dict.fromkeys(found) if p.exists()]


@attrs.frozen
class Leases:
    """Host-wide claims on uids: one lock file per uid, locked while an instance of this process has it.

    Seeing no process run as a uid is not enough: two nvcf-mono processes on one host (two agents, two
    platforms) could pick the same free uids at once. The lock is the kernel's, so a claim ends with the
    process that held it, even on ``kill -9``; instances it left running are still protected by their
    processes until they are adopted again.
    """

    directory: Path

    def claim(self, uids: frozenset[int]) -> list[int] | None:
        """The locked files of ``uids`` (give them to :meth:`release`), or None when another process holds one."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        held: list[int] = []
        for uid in sorted(uids):
            fd = os.open(self.directory / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.release(held)
                return None
            held.append(fd)
        return held

    @staticmethod
    def release(held: list[int]) -> None:
        for fd in held:
            with contextlib.suppress(OSError):
                os.close(fd)


class InstanceUsers:
    """Takes and gives back the users of instances, and prepares their directories."""

    def __init__(self, settings: LocalSettings, *, worker_argv: Sequence[str], log: logging.Logger) -> None:
        self._settings = settings
        self._log = log
        self._worker_argv = tuple(worker_argv)
        self.euid, self.egid = os.geteuid(), os.getegid()
        self.isolated = settings.run_as == "instance-users" or (settings.run_as == "auto" and self.euid == 0)
        self.range = UidRange(first=settings.first_uid, count=settings.uid_count, extra=settings.extra_gids)
        self._held: dict[int, str] = {}
        self._leases = Leases(settings.lease_dir)
        self._claims: dict[int, list[int]] = {}
        self._cursor = random.randrange(self.range.slots)
        self._reached: set[Path] = set()
        #: Directories whose lost grant could not be given back (warned of once).
        self._regrant_failed: set[Path] = set()
        self._probed = False

    def announce(self, state_dir: Path | None) -> None:
        """Say once, at start, who runs instances and what that means."""
        if self.isolated:
            r = self.range
            self._log.info(
                "local instances run as users of their own: uids %d-%d, two per instance, all in group %d "
                "(plugins.compute.local.run_as: %s)",
                r.first + 1,
                r.first + 2 * r.slots,
                r.shared_gid,
                self._settings.run_as,
            )
            return
        self._log.warning(
            "local instances run as this platform's own user (uid %d): a function or task process can read "
            "the state directory%s (platform-secret, endpoints.json with the admin token, the NATS "
            "credentials), other instances' directories and secrets, and every worker's token. Run nvcf-mono "
            "as root so each instance runs as users of its own (plugins.compute.local.run_as), or run only "
            "trusted functions on this backend",
            self.euid,
            f" {state_dir}" if state_dir is not None else "",
        )

    # ---- reaching the interpreter and the directories ---------------------------------------------

    def ready(self, instances_root: Path, environ: Mapping[str, str]) -> None:
        """Instance users can reach this Python and ``instances_root`` (granting search where allowed), and
        this Python starts as one of them. Blocking; raises LaunchError saying what to change.
        """
        instances_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.isolated:
            return
        targets = [instances_root] if self._probed else [*runtime_paths(self._worker_argv), instances_root]
        self._reach([t for t in targets if t not in self._reached])
        self._reached.update(targets)
        self.keep_reachable()
        if not self._probed:
            self._probe(environ)
            self._probed = True

    def _reach(self, targets: list[Path]) -> None:
        gid = self.range.shared_gid
        for directory, target in reach.unsearchable(targets, gid):
            if not self._settings.grant_search:
                raise LaunchError(
                    states.CREATE_CONTAINER_ERROR,
                    f"instance users (group {gid}) cannot reach {target}: {directory} does not let them search "
                    f"it. Grant them search permission (setfacl -m g:{gid}:x {directory}), or set "
                    "plugins.compute.local.grant_search: true, or install Python where other users may reach it",
                )
            try:
                how = reach.grant_search(directory, gid)
            except OSError as err:
                raise LaunchError(
                    states.CREATE_CONTAINER_ERROR,
                    f"instance users (group {gid}) cannot reach {target}, and granting them search permission on "
                    f"{directory} failed: {err}. Grant it yourself (setfacl -m g:{gid}:x {directory}) or set "
                    "plugins.compute.local.run_as: platform-user",
                ) from err
            self._log.warning(
                "granted instance users (group %d) search permission on %s with %s, so they reach %s "
                "(plugins.compute.local.grant_search: false leaves directories as they are)",
                gid,
                directory,
                how,
                target,
            )

    def keep_reachable(self) -> None:
        """What instance users were given search permission on, they still have: a ``chmod`` that clears a
        directory's group bits also clears its ACL's mask, and with it the grant, and running instances
        can no longer reach their directories. Granted again, with a warning (a failure is warned of once).
        """
        if not self.isolated or not self._reached or not self._settings.grant_search:
            return
        gid = self.range.shared_gid
        lost: list[tuple[Path, Path]] = []
        for reached in sorted(self._reached):
            try:
                lost += reach.unsearchable([reached], gid)
            except OSError:
                continue  # gone (a removed state directory): nothing to keep
        for directory, target in dict(lost).items():
            try:
                how = reach.grant_search(directory, gid)
            except OSError as err:
                if directory not in self._regrant_failed:
                    self._regrant_failed.add(directory)
                    self._log.warning(
                        "instance users (group %d) lost search permission on %s, which they need to reach %s, "
                        "and granting it again failed: %s",
                        gid,
                        directory,
                        target,
                        err,
                    )
                continue
            self._regrant_failed.discard(directory)
            self._log.warning(
                "instance users (group %d) had lost search permission on %s, which they need to reach %s (a "
                "chmod that clears a directory's group bits also clears its ACL's mask): granted again with %s",
                gid,
                directory,
                target,
                how,
            )

    def _probe(self, environ: Mapping[str, str]) -> None:
        """Start this Python as an instance user once: a failure names the cause before any instance fails."""
        # Imported here first, as the platform's user: Python caches the worker's compiled modules where
        # instance users cannot write, so no worker compiles them again at every start.
        importlib.import_module("nvcf_mono.worker.main")
        gid = self.range.shared_gid
        argv = [sys.executable, "-P", "-s", "-c", "import nvcf_mono"]
        try:
            done = subprocess.run(
                argv,
                env=dict(environ),
                cwd="/",
                user=gid,
                group=gid,
                extra_groups=[gid],
                umask=UMASK,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as err:
            problem = str(err)
        else:
            if done.returncode == 0:
                return
            problem = done.stderr.decode(errors="replace").strip()[-600:] or f"exit code {done.returncode}"
        raise LaunchError(
            states.CREATE_CONTAINER_ERROR,
            f"this Python ({sys.executable}) does not start as an instance user (uid {gid}): {problem}. Every "
            "directory and file of the Python installation and its packages must be readable by other users "
            "(search permission on the directories leading there is granted, see the log), or set "
            "plugins.compute.local.run_as: platform-user",
        )

    # ---- users --------------------------------------------------------------------------------------

    def take(self, instance_id: str) -> Slot | None:
        """Users for a new instance (None: the platform's own). Blocking; raises LaunchError when none is free."""
        if not self.isolated:
            return None
        busy = processes.users_running()
        slots = self.range.slots
        for step in range(slots):
            index = (self._cursor + step) % slots
            slot = self.range.slot(index)
            if index in self._held or slot.uids & busy:
                continue
            claim = self._claim(slot)
            if claim is None:
                continue  # another nvcf-mono of this host is giving them to an instance right now
            self._cursor = index + 1  # the next instance takes the next users: a uid is reused as late as possible
            self._held[index] = instance_id
            return slot
        raise LaunchError(
            states.CREATE_CONTAINER_ERROR,
            f"every user of plugins.compute.local.first_uid/uid_count ({slots} instances) is taken: "
            "configure a larger range",
        )

    def adopt(self, directory: Path, instance_id: str) -> Slot | None:
        """The users a running instance was started with (its directory's group says), held again."""
        try:
            gid = os.stat(directory).st_gid
        except OSError as err:
            if not self.isolated:
                return None  # made again; its processes are the platform user's
            raise LaunchError(states.CREATE_CONTAINER_ERROR, f"its directory is gone: {err}") from err
        slot = self.range.slot_of_gid(gid)
        if self.isolated and slot is None:
            raise LaunchError(
                states.CREATE_CONTAINER_ERROR,
                "it was started as the platform's own user, and instances now run as users of their own: "
                "it is replaced",
            )
        if not self.isolated and slot is not None:
            raise LaunchError(
                states.CREATE_CONTAINER_ERROR,
                "it was started as users of its own, and instances now run as the platform's user: it is replaced",
            )
        if slot is not None:
            if slot.index not in self._held and self._claim(slot) is None:
                raise LaunchError(
                    states.CREATE_CONTAINER_ERROR,
                    f"its users (uids {sorted(slot.uids)}) are claimed by another nvcf-mono on this host "
                    f"({self._leases.directory}): two agents share this state directory or this uid range",
                )
            self._held[slot.index] = instance_id
        return slot

    def _claim(self, slot: Slot) -> list[int] | None:
        try:
            claim = self._leases.claim(slot.uids)
        except OSError as err:
            raise LaunchError(
                states.CREATE_CONTAINER_ERROR,
                f"cannot claim instance users in {self._leases.directory} "
                f"(plugins.compute.local.lease_dir): {err.strerror or err}",
            ) from err
        if claim is not None:
            self._claims[slot.index] = claim
        return claim

    def give_back(self, slot: Slot | None) -> None:
        if slot is not None:
            self._held.pop(slot.index, None)
            self._leases.release(self._claims.pop(slot.index, []))

    def let_go(self) -> None:
        """The backend closes, leaving its instances running: end its claims, so whoever takes them over
        (another agent, or this process starting the backend again) can claim their users.
        """
        for claim in self._claims.values():
            self._leases.release(claim)
        self._claims.clear()
        self._held.clear()

    def open_directories(self, instances_root: Path) -> dict[str, Slot]:
        """``instance id -> users`` of the open instance directories under ``instances_root`` (their group is an
        instance's): how processes are recognised when their environment cannot be read.
        """
        out: dict[str, Slot] = {}
        if not self.isolated:
            return out
        try:
            entries = list(os.scandir(instances_root))
        except OSError:
            return out
        for entry in entries:
            try:
                gid = entry.stat(follow_symlinks=False).st_gid
            except OSError:
                continue
            slot = self.range.slot_of_gid(gid)
            if slot is not None:
                out[entry.name] = slot
        return out

    def owners(self, instances_root: Path) -> dict[int, str]:
        """``uid -> instance id`` of the open instance directories under ``instances_root``."""
        return {uid: iid for iid, slot in self.open_directories(instances_root).items() for uid in slot.uids}

    # ---- directories --------------------------------------------------------------------------------

    def make_directory(self, path: Path, slot: Slot | None) -> None:
        """The instance directory and its ``assets``, ``responses`` and ``results`` (owned as the module says)."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subs = ("assets", "responses", "results")
        if slot is None:
            for directory in (path, *(path / name for name in subs)):
                directory.mkdir(exist_ok=True, mode=0o700)
            return
        owners = {"assets": slot.worker.uid, "responses": slot.worker.uid, "results": slot.server.uid}
        path.mkdir(exist_ok=True, mode=0o700)
        os.chown(path, self.euid, slot.gid, follow_symlinks=False)
        os.chmod(path, DIRECTORY_MODE)
        for name in subs:
            target = path / name
            target.mkdir(exist_ok=True, mode=0o700)
            os.chown(target, owners[name], slot.gid, follow_symlinks=False)
            os.chmod(target, 0o750)

    def close(self, path: Path, slot: Slot | None, *, secrets: Path) -> None:
        """A released instance: what still runs as its users dies, its ``secrets`` file goes, and its
        directory is the agent's alone.

        In that order: nothing of the instance is left to write the file again once it is removed, and
        a directory seen closed no longer holds it.
        """
        if slot is not None:
            processes.kill_users(slot.uids)
        secrets.unlink(missing_ok=True)
        if slot is None:
            return
        close_directory(path, self.euid, self.egid)
        self.give_back(slot)

    def close_strays(self, instances_root: Path, keep: frozenset[str]) -> list[str]:
        """Close the open directories of instances no record holds (found after a restart)."""
        closed = []
        for instance_id, slot in sorted(self.open_directories(instances_root).items()):
            if instance_id in keep:
                continue
            if slot.index not in self._held:
                try:
                    claim = self._leases.claim(slot.uids)
                except OSError:
                    claim = []  # no claims can be made here, so nobody else holds them through it
                if claim is not None:  # else another nvcf-mono gave them to an instance of its own since
                    processes.kill_users(slot.uids)
                    self._leases.release(claim)
            close_directory(instances_root / instance_id, self.euid, self.egid)
            closed.append(instance_id)
        return closed


def close_directory(path: Path, uid: int, gid: int) -> None:
    try:
        os.chmod(path, 0o700)
        os.chown(path, uid, gid, follow_symlinks=False)
    except FileNotFoundError:
        pass


def run_as(slot: Slot | None, role: str) -> RunAs | None:
    """The user one of an instance's processes runs as (None: the platform's own)."""
    if slot is None:
        return None
    return slot.worker if role == "worker" else slot.server
