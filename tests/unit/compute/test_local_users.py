"""Instance users of the local backend: their uids, the search permission they get, their directories."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvcf_mono.contracts import env, states
from nvcf_mono.contracts.messages import Action, CreationMessage, LaunchSpecification
from nvcf_mono.planes.compute.backends.local import LocalBackend, processes, reach
from nvcf_mono.planes.compute.backends.local.environment import container_environment
from nvcf_mono.planes.compute.backends.local.images import LaunchError, resolve
from nvcf_mono.planes.compute.backends.local.users import DIRECTORY_MODE, InstanceUsers, Leases, UidRange
from nvcf_mono.planes.compute.config import HealthSettings, Image, LocalSettings

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other users, chown, ACLs of any directory)")


def test_each_instance_takes_two_uids_after_the_shared_group() -> None:
    r = UidRange(first=5000, count=7)
    assert r.shared_gid == 5000 and r.slots == 3
    first, last = r.slot(0), r.slot(2)
    assert (first.server.uid, first.worker.uid, first.gid) == (5001, 5002, 5001)
    assert first.server.groups == first.worker.groups == (5000,) and first.server.umask == 0o007
    assert (last.server.uid, last.worker.uid) == (5005, 5006)
    assert r.slot_of_uid(5002) == first and r.slot_of_gid(5001) == first
    assert r.slot_of_gid(5002) is None  # a worker's uid is no instance's group
    for outside in (5000, 4999, 5007, 0):
        assert r.slot_of_uid(outside) is None and r.slot_of_gid(outside) is None
    # A GPU device group, where the driver does not let every user open the GPUs.
    gpus = UidRange(first=5000, count=7, extra=(44,)).slot(0)
    assert gpus.server.groups == gpus.worker.groups == (5000, 44)


def test_the_range_must_fit_below_the_largest_uid() -> None:
    from nvcf_mono.structure import StructureError, structure

    with pytest.raises(StructureError, match="uid_count"):
        structure(LocalSettings, {"first_uid": 4_000_000_000, "uid_count": 300_000_000})


def test_tenant_arguments_are_never_filled_with_the_platforms_placeholders(tmp_path: Path) -> None:
    catalog = {"srv": Image(command=("{python}", "-m", "srv", "--port", "{port}"), env={"DIR": "{instance_dir}"})}
    command = resolve(
        catalog, "srv", "--x {python} --y {port} --z {instance_dir}", port=1234, python=sys.executable,
        instance_dir=tmp_path, path="/usr/bin:/bin",
    )  # fmt: skip
    assert command.argv == (
        sys.executable, "-m", "srv", "--port", "1234", "--x", "{python}", "--y", "{port}", "--z", "{instance_dir}"
    )  # fmt: skip
    assert command.env == {"DIR": str(tmp_path)}


def _message(environment: dict[str, str]) -> CreationMessage:
    return CreationMessage(
        request_id="r",
        nca_id="a",
        action=Action.REQUEST_INSTANCES,
        cluster_id="c",
        instance_count=1,
        instance_type_name="ON-PREM.GPU.H100_1x",
        instance_type_value="ON-PREM.GPU.H100",
        gpu_type="H100",
        requested_gpu_count=1,
        message_batch_id="b",
        created_at="2026-01-01T00:00:00Z",
        launch_specification=LaunchSpecification(gpu_name="H100", container_image="echo", environment=environment),
    )


def test_the_agent_refuses_what_the_api_would_have_refused() -> None:
    backend = LocalBackend(
        catalog={}, environ={}, health=HealthSettings(), local=LocalSettings(), log=logging.getLogger("t")
    )
    attack = json.dumps([{"key": "PYTHONWARNINGS", "value": "ignore::antigravity.X"}, {"key": "BROWSER", "value": "x"}])
    refusal = backend.refuse(_message({env.INFERENCE_CONTAINER_ENV: attack}))
    assert refusal is not None and refusal.cause == states.CREATE_CONTAINER_ERROR
    assert "'PYTHONWARNINGS' is not allowed" in refusal.detail and "refused by the cluster's agent" in refusal.detail
    args = backend.refuse(_message({env.INFERENCE_CONTAINER_ARGS: "a\0b"}))
    assert args is not None and "NUL" in args.detail
    assert backend.refuse(_message({env.INFERENCE_CONTAINER_ENV: json.dumps([{"key": "A", "value": "1"}])})) is None
    # And again where the environment is built (an instance taken over after a restart is not asked first).
    with pytest.raises(LaunchError, match="'ld_preload' is not allowed"):
        container_environment({env.INFERENCE_CONTAINER_ENV: json.dumps([{"key": "ld_preload", "value": "/x.so"}])})


def test_the_agent_never_writes_its_logs_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (tmp_path / "inference.log").symlink_to(target)
    with pytest.raises(OSError):
        processes.open_log(tmp_path / "inference.log")
    assert processes.read_tail(tmp_path / "inference.log", 100) == ""
    assert target.read_text() == "untouched"


def _acl(path: Path) -> list[tuple[int, int, int]]:
    raw = os.getxattr(path, reach.ACL_XATTR)
    return [struct.unpack_from("<HHI", raw, offset) for offset in range(4, len(raw), 8)]


def _acls_work(path: Path) -> bool:
    try:
        reach.grant_search(path, 4242)
    except OSError:
        return False
    return bool(os.listxattr(path))


def test_search_is_granted_to_the_group_alone_and_nothing_else_widens(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    probe = tmp_path / "probe"
    probe.mkdir()
    if not _acls_work(probe):
        pytest.skip("this filesystem has no POSIX ACLs")
    assert not reach.searchable(private, 7000)
    assert reach.grant_search(private, 7000) == "a POSIX ACL entry (group:7000:--x)"
    assert reach.searchable(private, 7000) and not reach.searchable(private, 7001)
    assert stat.S_IMODE(private.stat().st_mode) == 0o710  # the group bits show the mask: search only
    assert not private.stat().st_mode & stat.S_IXOTH
    # A second group keeps the first's entry; the mask never grants more than search to anyone.
    reach.grant_search(private, 7001)
    entries = _acl(private)
    assert (0x08, 1, 7000) in entries and (0x08, 1, 7001) in entries and (0x10, 1, 0xFFFFFFFF) in entries
    assert private not in [d for d, _ in reach.unsearchable([private / "inside"], 7000)]


def test_the_directories_on_the_way_are_found_by_path_and_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real" / "bin"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    found = list(reach.passed_through(tmp_path / "link" / "bin"))
    assert tmp_path / "link" in found and tmp_path / "real" in found and real in found and Path("/") in found


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may reach (pytest's own are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="nvcf-reach-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@root_only
def test_an_instance_user_passes_a_directory_it_was_granted_search_on(open_dir: Path) -> None:
    private = open_dir / "private"
    (private / "inner").mkdir(parents=True, mode=0o755)
    private.chmod(0o700)
    if not _acls_work(private / "inner"):
        pytest.skip("this filesystem has no POSIX ACLs")

    def passes(groups: list[int]) -> bool:
        run = subprocess.run(
            ["/bin/ls", str(private / "inner")], user=7002, group=7002, extra_groups=groups, check=False
        )
        return run.returncode == 0

    assert not passes([7000])
    reach.grant_search(private, 7000)
    assert passes([7000]) and not passes([])
    listing = subprocess.run(["/bin/ls", str(private)], user=7002, group=7002, extra_groups=[7000], check=False)
    assert listing.returncode != 0  # search, not read: the directory cannot be listed


@root_only
def test_search_permission_a_chmod_took_away_is_given_back(open_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The platforms' own range: ready() grants it on this Python's directories, as any platform of this
    # host has already done, and starts this Python as one of its users.
    settings = LocalSettings(run_as="instance-users", lease_dir=open_dir / "leases")
    users = InstanceUsers(settings, worker_argv=(), log=logging.getLogger("t"))
    gid = users.range.shared_gid
    private = open_dir / "private"
    private.mkdir(mode=0o700)
    if not _acls_work(private):
        pytest.skip("this filesystem has no POSIX ACLs")
    instances = private / "instances"
    users.ready(instances, os.environ)
    assert reach.searchable(private, gid)

    private.chmod(0o700)  # what a pytest session does to /tmp/pytest-of-root: the ACL's mask goes too
    assert not reach.searchable(private, gid)
    with caplog.at_level(logging.WARNING):
        users.keep_reachable()
    assert reach.searchable(private, gid)
    assert "had lost search permission on " + str(private) in caplog.text
    caplog.clear()
    users.keep_reachable()  # nothing lost: nothing said
    assert caplog.text == ""
    shutil.rmtree(private)
    users.keep_reachable()  # what is gone has nothing to keep, and is no error


@root_only
def test_an_instance_directory_is_the_agents_open_to_the_instance_and_closed_when_released(tmp_path: Path) -> None:
    users = InstanceUsers(LocalSettings(first_uid=3_000_000_000, uid_count=9), worker_argv=(), log=logging.getLogger())
    assert users.isolated
    slot = users.take("i-1")
    assert slot is not None and users.take("i-2") != slot
    directory = tmp_path / "instances" / "i-1"
    users.make_directory(directory, slot)
    st = directory.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, slot.gid, DIRECTORY_MODE)
    owners = {name: (directory / name).stat().st_uid for name in ("assets", "responses", "results")}
    assert owners == {"assets": slot.worker.uid, "responses": slot.worker.uid, "results": slot.server.uid}
    assert users.owners(directory.parent) == {slot.server.uid: "i-1", slot.worker.uid: "i-1"}
    assert users.adopt(directory, "i-1") == slot

    # Whatever runs as the instance's users dies with it, wherever it went.
    sleeper = subprocess.Popen(["sleep", "60"], user=slot.server.uid, group=slot.gid, start_new_session=True)
    secrets = directory / "secrets.json"
    secrets.write_text("{}")
    users.close(directory, slot, secrets=secrets)
    assert sleeper.wait(timeout=10) == -9
    assert not secrets.exists(), "gone by the time the directory is closed"
    st = directory.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, os.getegid(), 0o700)
    assert users.owners(directory.parent) == {}


@root_only
def test_a_new_instance_never_takes_users_a_process_still_runs_as(tmp_path: Path) -> None:
    users = InstanceUsers(LocalSettings(first_uid=3_000_000_100, uid_count=5), worker_argv=(), log=logging.getLogger())
    busy = users.range.slot(0)
    sleeper = subprocess.Popen(["sleep", "60"], user=busy.worker.uid, group=busy.gid)
    try:
        for _ in range(4):
            slot = users.take(f"i-{time.monotonic()}")
            assert slot is not None and slot != busy
            users.give_back(slot)
        taken = users.take("a")
        with pytest.raises(LaunchError, match=r"every user of plugins\.compute\.local\.first_uid/uid_count"):
            users.take("b")
        users.give_back(taken)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_two_agents_on_one_host_never_give_the_same_users_to_two_instances(tmp_path: Path) -> None:
    """Both see no process run as any uid; the host-wide claims keep them apart (and go with their holder)."""
    settings = LocalSettings(run_as="instance-users", first_uid=3_000_000_200, uid_count=5, lease_dir=tmp_path)
    one, two = (InstanceUsers(settings, worker_argv=(), log=logging.getLogger()) for _ in range(2))
    taken = one.take("a")
    assert taken is not None
    for _ in range(3):  # whatever its cursor, the other agent never takes the claimed users
        other = two.take("b")
        assert other is not None and other.uids.isdisjoint(taken.uids)
        two.give_back(other)
    both = two.take("c")
    with pytest.raises(LaunchError, match="every user"):
        two.take("d")
    one.give_back(taken)
    assert two.take("e") == taken
    assert both is not None


@root_only
def test_an_instance_whose_users_another_agent_claimed_is_not_adopted(tmp_path: Path) -> None:
    settings = LocalSettings(first_uid=3_000_000_300, uid_count=5, lease_dir=tmp_path / "leases")
    one, two = (InstanceUsers(settings, worker_argv=(), log=logging.getLogger()) for _ in range(2))
    taken = one.take("a")
    assert taken is not None
    directory = tmp_path / "a"
    directory.mkdir()
    os.chown(directory, 0, taken.gid)
    with pytest.raises(LaunchError, match="claimed by another nvcf-mono on this host"):
        two.adopt(directory, "a")
    one.give_back(taken)
    assert two.adopt(directory, "a") == taken


def test_a_backend_that_closes_leaving_instances_running_lets_their_users_be_claimed(tmp_path: Path) -> None:
    """The next backend (another agent, or this process starting again) takes the running instances over."""
    settings = LocalSettings(run_as="instance-users", first_uid=3_000_000_400, uid_count=5, lease_dir=tmp_path)
    closing = InstanceUsers(settings, worker_argv=(), log=logging.getLogger())
    taken = closing.take("a")
    assert taken is not None
    leases = Leases(tmp_path)
    assert leases.claim(taken.uids) is None
    closing.let_go()
    claim = leases.claim(taken.uids)
    assert claim is not None
    leases.release(claim)
