"""What the containers backend asks the engine to create, and where it looks for the engine (no engine needed)."""

from __future__ import annotations

from pathlib import Path

import attrs

from nvcf_mono.planes.compute.backends import LaunchSpec
from nvcf_mono.planes.compute.backends.containers.engine import gpu_devices, socket_candidates
from nvcf_mono.planes.compute.backends.containers.spec import create_body, memory_bytes
from nvcf_mono.planes.compute.config import ContainerSettings
from nvcf_mono.planes.compute.gpus import Allocation
from nvcf_mono.planes.compute.log_stamps import StampedLines, new_lines

from .test_kube_manifests import launch


def spec(task: bool = False) -> LaunchSpec:
    return attrs.evolve(
        launch(task),
        directory=Path("/state/instances/i-1"),
        allocation=Allocation(gpu="H100", node=0, devices=(2, 3)),
        cpus=4,
        memory="16G",
    )


def body(task: bool = False, **settings: object) -> dict:
    return create_body(
        spec(task),
        image="nvcr.io/acme/llm:2.1",
        args=["--model", "/models/a"],
        environment={"B": "2", "A": "1"},
        ports={9000: 41000},
        settings=ContainerSettings(**settings),  # type: ignore[arg-type]
        gpus=["nvidia.com/gpu=2", "nvidia.com/gpu=3"],
        kind="podman",
    )


def test_the_container_mounts_only_its_instance_directories_and_publishes_on_loopback() -> None:
    made = body()
    host = made["HostConfig"]
    assert host["Binds"] == [
        "/state/instances/i-1/assets:/var/inf/assets:rw",
        "/state/instances/i-1/responses:/var/inf/responses:rw",
        "/state/instances/i-1/secrets:/var/secrets:ro",
    ]
    assert host["PortBindings"] == {"9000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "41000"}]}
    assert made["ExposedPorts"] == {"9000/tcp": {}}
    assert host["RestartPolicy"] == {"Name": "no"} and "no-new-privileges" in host["SecurityOpt"]
    assert made["Cmd"] == ["--model", "/models/a"] and "Entrypoint" not in made  # the image's entrypoint stays
    assert made["Env"] == ["A=1", "B=2"]
    assert made["Labels"]["nvca.nvcf.nvidia.io/instance-id"] == f"0-sr-{spec().request_id}"
    assert made["Labels"]["function-id"] == "fn-1" and made["Labels"]["nvca.nvcf.nvidia.io/cluster-id"] == "cluster-1"


def test_limits_and_gpus_follow_the_instance_type_and_the_engine() -> None:
    host = body()["HostConfig"]
    assert host["NanoCpus"] == 4_000_000_000 and host["Memory"] == 16 * 1024**3 and host["ShmSize"] == 1024**3
    assert [d["PathOnHost"] for d in host["Devices"]] == ["nvidia.com/gpu=2", "nvidia.com/gpu=3"]
    docker = create_body(
        spec(),
        image="x",
        args=[],
        environment={},
        ports={8000: 1},
        settings=ContainerSettings(limit_resources=False, network="gpu-net"),
        gpus=["nvidia.com/gpu=2"],
        kind="docker",
    )
    assert docker["HostConfig"]["DeviceRequests"] == [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=2"]}]
    assert "NanoCpus" not in docker["HostConfig"] and "Memory" not in docker["HostConfig"]
    assert docker["HostConfig"]["NetworkMode"] == "gpu-net" and "Cmd" not in docker  # no args: the image's CMD
    assert memory_bytes("3G") == 3 * 1024**3 and memory_bytes(None) is None and memory_bytes("lots") is None


def test_a_task_mounts_var_task() -> None:
    binds = body(task=True)["HostConfig"]["Binds"]
    assert "/state/instances/i-1/task:/var/task:rw" in binds and "nvca.nvcf.nvidia.io/task-id" in body(True)["Labels"]


def test_gpus_go_by_cdi_only_where_asked_or_found() -> None:
    assert gpu_devices("none", (0, 1)) == []
    assert gpu_devices("cdi", (0, 1)) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert gpu_devices("cdi", ()) == []


def test_the_engine_socket_is_the_configured_one_else_the_first_found(tmp_path: Path) -> None:
    assert socket_candidates(ContainerSettings(socket="/x/docker.sock"), {}) == ["unix:///x/docker.sock"]
    assert socket_candidates(ContainerSettings(socket="unix:///y.sock"), {}) == ["unix:///y.sock"]
    found = socket_candidates(ContainerSettings(), {"DOCKER_HOST": "unix:///custom.sock", "XDG_RUNTIME_DIR": "/no"})
    assert found[0] == "unix:///custom.sock"
    assert socket_candidates(ContainerSettings(), {"DOCKER_HOST": "tcp://1.2.3.4:2375"}) == [
        f"unix://{p}" for p in ("/run/podman/podman.sock", "/var/run/docker.sock") if Path(p).is_socket()
    ]


def test_the_container_log_is_copied_once_line_by_line_after_the_mark() -> None:
    raw = (
        "2026-12-04T03:30:25.000000001Z first\n"
        "2026-12-04T03:30:25.5Z second\n"
        "a line the engine wrote without a stamp\n"
        "2026-12-04T04:30:26+01:00 third\n"
    )
    text, mark = new_lines(raw, None)
    assert text == "first\nsecond\na line the engine wrote without a stamp\nthird\n"
    again, later = new_lines(raw + "2026-12-04T03:30:27.25Z fourth\n", mark)  # since= is whole seconds
    assert again == "fourth\n" and later is not None and mark is not None and later > mark
    assert new_lines(raw, later) == ("", later)
    assert new_lines("", None) == ("", None)


def test_lines_stamped_the_same_second_are_told_apart_by_their_count() -> None:
    # Podman's API stamps to the second: a restarted container's new line shares its predecessor's stamp.
    one = "2026-12-04T03:38:13Z giving up\n"
    text, mark = new_lines(one, None)
    assert text == "giving up\n" and mark is not None and mark[2] == 1
    text, mark = new_lines(one * 3, mark)
    assert text == "giving up\ngiving up\n" and mark is not None and mark[2] == 3
    assert new_lines(one * 3, mark) == ("", mark)


def test_a_followed_log_read_again_sends_only_what_is_new_even_lines_of_one_stamp() -> None:
    # The Kubernetes backend takes a followed log a line at a time; cut short, it reads it again from
    # before the last line sent: two lines of the very same nanosecond are told apart by their count.
    lines = [
        "2026-12-07T10:00:00.000000001Z one",
        "2026-12-07T10:00:00.000000002Z two",
        "2026-12-07T10:00:00.000000002Z two again",
        "2026-12-07T10:00:01Z three",
    ]
    first = StampedLines(None)
    assert [first.new(line) for line in lines[:2]] == ["one", "two"]
    again = StampedLines(first.mark)  # the stream was cut after "two"
    assert [again.new(line) for line in lines] == [None, None, "two again", "three"]
    adopted = StampedLines((1796637601, 0, 0))  # an agent that took the pod over at 10:00:01
    assert [adopted.new(line) for line in lines] == [None, None, None, "three"]
