"""The task sidecar's settings from the task contract, and what it reads of the task's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvcf_mono.contracts import env
from nvcf_mono.worker.config import WorkerConfigError
from nvcf_mono.worker.main import build
from nvcf_mono.worker.task import Progress, TaskConfig, TaskWorker, _scan, read_progress

BASE = {
    env.NVCT_TASK_ID: "t-1",
    env.NVCF_WORKER_TOKEN: "nvcft_x",
    env.NVCF_FQDN_GRPC: "127.0.0.1:8081",
    env.NVCT_PROGRESS_FILE_PATH: "/i/progress",
    env.NVCT_RESULTS_DIR: "/i/results",
}


def test_the_task_contract_makes_a_task_sidecar() -> None:
    worker, secrets = build({**BASE, env.FUNCTION_SECRETS_PRESENT: "true", env.SECRETS_FILE: "/i/secrets.json"})
    assert isinstance(worker, TaskWorker) and secrets
    config = worker.config
    assert isinstance(config, TaskConfig)
    assert (config.task_id, config.progress_file, config.results_dir) == ("t-1", "/i/progress", "/i/results")
    assert config.heartbeat_interval == 30.0 and config.secrets_file == "/i/secrets.json"
    assert TaskConfig.from_env({**BASE, env.NVCT_HEARTBEAT_INTERVAL: "2.5"}).heartbeat_interval == 2.5


def test_every_task_contract_variable_for_the_worker_is_read() -> None:
    meant = {v.name for v in env.CONTRACT if v.name.startswith("NVCT_") and "worker" in v.read_by}
    # NVCT_TASK_NAME and NVCT_NCA_ID are for the task itself; the worker's token names the task.
    assert meant - {env.NVCT_TASK_NAME, env.NVCT_NCA_ID, env.NVCT_RESULT_HANDLING} == {
        env.NVCT_TASK_ID,
        env.NVCT_PROGRESS_FILE_PATH,
        env.NVCT_RESULTS_DIR,
        env.NVCT_HEARTBEAT_INTERVAL,
    }


@pytest.mark.parametrize("missing", [env.NVCT_PROGRESS_FILE_PATH, env.NVCT_RESULTS_DIR, env.NVCF_WORKER_TOKEN])
def test_a_missing_variable_is_named(missing: str) -> None:
    with pytest.raises(WorkerConfigError, match=missing):
        TaskConfig.from_env({k: v for k, v in BASE.items() if k != missing})


def test_progress_is_read_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    assert read_progress(str(path)) is None
    path.write_text('{"percentComplete": 4')  # half-written
    assert read_progress(str(path)) is None
    path.write_text(json.dumps({"percentComplete": 150, "name": "n", "metadata": {"a": 1}, "lastUpdatedAt": "t"}))
    assert read_progress(str(path)) == Progress(percent=100, name="n", metadata={"a": 1}, last_updated_at="t")
    path.write_text(json.dumps({"percentComplete": "many"}))
    assert read_progress(str(path)) is None


def test_results_are_listed_with_relative_names(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"22")
    found = _scan(str(tmp_path))
    assert {name: size for name, (size, _) in found.items()} == {"a.txt": 1, "sub/b.bin": 2}


def test_bad_task_values_are_each_named() -> None:
    environ = {**BASE, env.NVCT_HEARTBEAT_INTERVAL: "0.01", env.HEALTH_PORT: "port", env.NVCF_FQDN_GRPC: "nowhere"}
    with pytest.raises(WorkerConfigError) as caught:
        TaskConfig.from_env(environ)
    assert sorted(str(caught.value).splitlines()) == [
        "HEALTH_PORT: expected an integer, got 'port'",
        "NVCF_FQDN_GRPC: must be host:port, got 'nowhere'",
        "NVCT_HEARTBEAT_INTERVAL: must be at least 0.1, got 0.01",
    ]
