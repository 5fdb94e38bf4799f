"""The worker reads every variable of the instance environment contract meant for it, and says what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvcf_mono.contracts import env
from nvcf_mono.worker.config import WorkerConfig, WorkerConfigError

BASE = {
    env.NVCF_WORKER_TOKEN: "worker-token",
    env.NVCF_FQDN_GRPC: "invocation.example.com:10081",
    env.FUNCTION_ID: "fid",
    env.FUNCTION_VERSION_ID: "fvid",
}

TELEMETRY = '{"traces": {"url": "https://otel.example.com/v1/traces", "headers": {"Authorization": "Bearer t"}}}'

#: variable -> (value, config attribute, expected value of the attribute)
READS: dict[str, tuple[str, str, Any]] = {
    env.NVCF_WORKER_TOKEN: ("another-token", "worker_token", "another-token"),
    env.NVCF_FQDN_GRPC: ("10.0.0.7:9191", "grpc_address", "10.0.0.7:9191"),
    env.FUNCTION_ID: ("f-2", "function_id", "f-2"),
    env.FUNCTION_VERSION_ID: ("v-2", "function_version_id", "v-2"),
    env.FUNCTION_NAME: ("echo", "function_name", "echo"),
    env.FUNCTION_TYPE: ("streaming", "function_type", "STREAMING"),
    env.FUNCTION_SECRETS_PRESENT: ("TRUE", "secrets_present", True),
    env.NCA_ID: ("nca-1", "nca_id", "nca-1"),
    env.INSTANCE_ID: ("pod-7", "instance_id", "pod-7"),
    env.ICMS_REQUEST_ID: ("icms-3", "instance_id", "icms-3"),
    env.NVCF_INSTANCE_ID: ("nvcf-pod-7", "instance_id", "nvcf-pod-7"),
    env.INFERENCE_URL: ("/v1/infer", "inference_url", "/v1/infer"),
    env.INFERENCE_PORT: ("9001", "inference_port", 9001),
    env.INFERENCE_PROTOCOL: ("GRPC", "inference_protocol", "grpc"),
    env.INFERENCE_HEALTH_ENDPOINT: ("/health", "health_endpoint", "/health"),
    env.INFERENCE_HEALTH_PORT: ("9002", "health_port", 9002),
    env.INFERENCE_HEALTH_PROTOCOL: ("grpc", "health_protocol", "grpc"),
    env.INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE: ("204", "health_expected_status", 204),
    env.INFERENCE_HEALTH_TIMEOUT: ("2.5", "health_timeout", 2.5),
    env.MAX_REQUEST_CONCURRENCY: ("16", "max_concurrency", 16),
    env.HELM_CHART_INFERENCE_SERVICE_NAME: ("my-svc", "inference_host", "my-svc"),
    env.INFERENCE_HOST: ("10.1.2.3", "inference_host", "10.1.2.3"),
    env.HEALTH_PORT: ("8090", "own_health_port", 8090),
    env.INFERENCE_READY_TIMEOUT: ("90", "ready_timeout", 90.0),
    env.WORKER_HEALTH_INTERVAL: ("0.25", "health_interval", 0.25),
    env.GPU_NAME: ("H100", "gpu", "H100"),
    env.INSTANCE_TYPE: ("ON-PREM.GPU.H100_1x", "instance_type", "ON-PREM.GPU.H100_1x"),
    env.BACKEND: ("local", "backend", "local"),
    env.REGION: ("us-west-1", "region", "us-west-1"),
    env.BASE_ASSET_DIR: ("/var/inf/inputAssets", "asset_dir", "/var/inf/inputAssets"),
    env.BASE_RESPONSE_DIR: ("/var/inf/response", "response_dir", "/var/inf/response"),
    env.INFERENCE_ASSET_DIR: ("/var/inf/assets", "inference_asset_dir", "/var/inf/assets"),
    env.INFERENCE_RESPONSE_DIR: ("/var/inf/responses", "inference_response_dir", "/var/inf/responses"),
    env.SECRETS_FILE: ("/var/secrets/secrets.json", "secrets_file", "/var/secrets/secrets.json"),
    env.SECRETS_REFRESH_INTERVAL: ("2.5", "secrets_refresh", 2.5),
    env.NVCF_FQDN_GRPC_TLS: ("TRUE", "grpc_tls", True),
    env.NVCF_FQDN_GRPC_CA: ("-----BEGIN CERTIFICATE-----", "grpc_ca", "-----BEGIN CERTIFICATE-----"),
    env.NVCF_FQDN_GRPC_FILE: ("/inst/grpc-address", "grpc_address_file", "/inst/grpc-address"),
    env.NVCF_TRACES_ENDPOINT: ("http://collector:4318", "traces_endpoint", "http://collector:4318"),
    env.NVCF_TELEMETRY_EXPORTS: (TELEMETRY, "telemetry_exports", TELEMETRY),
    env.NVCF_TELEMETRY_PROXY: ("http://proxy.corp:3128", "telemetry_proxy", "http://proxy.corp:3128"),
}


def test_every_variable_the_worker_reads_is_covered() -> None:
    # The task contract (NVCT_*) is the task sidecar's: tests/unit/worker/test_task.py.
    meant_for_worker = {v.name for v in env.CONTRACT if "worker" in v.read_by and not v.name.startswith("NVCT_")}
    assert meant_for_worker == set(READS), "a contract variable for the worker has no test here (or vice versa)"


@pytest.mark.parametrize("name", sorted(READS))
def test_each_variable_sets_its_setting(name: str) -> None:
    value, attribute, expected = READS[name]
    config = WorkerConfig.from_env({**BASE, name: value})
    assert getattr(config, attribute) == expected
    # Without it, the setting is something else: the variable really is what sets it.
    environ = {k: v for k, v in BASE.items() if k != name}
    if name in BASE:
        environ[name] = "x:1" if name == env.NVCF_FQDN_GRPC else "x"
    assert getattr(WorkerConfig.from_env(environ), attribute) != expected


def test_defaults_are_the_contracts() -> None:
    config = WorkerConfig.from_env(BASE)
    assert (config.inference_host, config.inference_port, config.health_port) == ("127.0.0.1", 8000, 8000)
    assert (config.inference_url, config.health_endpoint, config.health_expected_status) == (
        "/",
        "/v2/health/ready",
        200,
    )
    assert (config.inference_protocol, config.health_protocol, config.function_type) == ("http", "http", "DEFAULT")
    assert (config.max_concurrency, config.own_health_port, config.secrets_present) == (1, 0, False)
    assert config.health_timeout == 10.0 and config.ready_timeout == 7200.0 and config.health_interval == 1.0
    assert (config.asset_dir, config.response_dir, config.secrets_file) == (
        "/tmp/nvcf-assets",
        "/tmp/nvcf-responses",
        None,
    )
    assert config.inference_base == "http://127.0.0.1:8000"


def test_health_port_follows_the_inference_port_unless_set() -> None:
    assert WorkerConfig.from_env({**BASE, env.INFERENCE_PORT: "9100"}).health_port == 9100
    assert (
        WorkerConfig.from_env({**BASE, env.INFERENCE_PORT: "9100", env.INFERENCE_HEALTH_PORT: "9200"}).health_port
        == 9200
    )


def test_the_agents_inference_host_wins_over_the_helm_service() -> None:
    config = WorkerConfig.from_env(
        {**BASE, env.HELM_CHART_INFERENCE_SERVICE_NAME: "svc", env.INFERENCE_HOST: "10.9.9.9"}
    )
    assert config.inference_host == "10.9.9.9"


def test_the_server_sees_the_request_directories_where_the_worker_does_unless_told() -> None:
    same = WorkerConfig.from_env({**BASE, env.BASE_ASSET_DIR: "/i/assets", env.BASE_RESPONSE_DIR: "/i/responses"})
    assert (same.inference_asset_dir, same.inference_response_dir) == ("/i/assets", "/i/responses")
    mounted = WorkerConfig.from_env(
        {**BASE, env.BASE_ASSET_DIR: "/i/assets", env.INFERENCE_ASSET_DIR: "/var/inf/assets"}
    )
    assert (mounted.asset_dir, mounted.inference_asset_dir) == ("/i/assets", "/var/inf/assets")


def test_the_instance_id_falls_back_to_the_instance_request() -> None:
    every = {**BASE, env.INSTANCE_ID: "pod", env.NVCF_INSTANCE_ID: "nvcf-pod", env.ICMS_REQUEST_ID: "icms"}
    assert WorkerConfig.from_env(every).instance_id == "pod"
    assert (
        WorkerConfig.from_env({**BASE, env.NVCF_INSTANCE_ID: "nvcf-pod", env.ICMS_REQUEST_ID: "icms"}).instance_id
        == "nvcf-pod"
    )
    assert WorkerConfig.from_env(BASE).instance_id == "instance"


def test_every_problem_is_listed_at_once() -> None:
    environ = {
        env.NVCF_FQDN_GRPC: "no-port",
        env.INFERENCE_PORT: "eighty",
        env.INFERENCE_HEALTH_PORT: "70000",
        env.INFERENCE_PROTOCOL: "websocket",
        env.INFERENCE_HEALTH_PROTOCOL: "tcp",
        env.INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE: "42",
        env.INFERENCE_HEALTH_TIMEOUT: "0",
        env.MAX_REQUEST_CONCURRENCY: "16385",
        env.HEALTH_PORT: "-1",
        env.INFERENCE_READY_TIMEOUT: "soon",
        env.WORKER_HEALTH_INTERVAL: "-2",
        env.FUNCTION_TYPE: "BATCH",
        env.FUNCTION_SECRETS_PRESENT: "maybe",
        env.INFERENCE_URL: "echo",
        env.BASE_ASSET_DIR: "relative/assets",
        env.BASE_RESPONSE_DIR: "relative/responses",
        env.NVCF_TELEMETRY_EXPORTS: '{"events": {"url": "https://x"}}',
    }
    with pytest.raises(WorkerConfigError) as caught:
        WorkerConfig.from_env(environ)
    lines = str(caught.value).splitlines()
    expected = [
        "NVCF_WORKER_TOKEN: is required",
        "FUNCTION_ID: is required",
        "FUNCTION_VERSION_ID: is required",
        "NVCF_FQDN_GRPC: must be host:port, got 'no-port'",
        "INFERENCE_PORT: expected an integer, got 'eighty'",
        "INFERENCE_HEALTH_PORT: must be between 1 and 65535, got 70000",
        "INFERENCE_PROTOCOL: expected one of 'http', 'grpc', got 'websocket'",
        "INFERENCE_HEALTH_PROTOCOL: expected one of 'http', 'grpc', got 'tcp'",
        "INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE: must be between 100 and 599, got 42",
        "INFERENCE_HEALTH_TIMEOUT: must be greater than 0, got 0.0",
        "MAX_REQUEST_CONCURRENCY: must be between 1 and 16384, got 16385",
        "HEALTH_PORT: must be between 0 and 65535, got -1",
        "INFERENCE_READY_TIMEOUT: expected a number, got 'soon'",
        "WORKER_HEALTH_INTERVAL: must be greater than 0, got -2.0",
        "FUNCTION_TYPE: expected one of 'DEFAULT', 'STREAMING', 'LLM', got 'BATCH'",
        "FUNCTION_SECRETS_PRESENT: expected true or false, got 'maybe'",
        "INFERENCE_URL: must be a path starting with '/', got 'echo'",
        "BASE_ASSET_DIR: must be a path starting with '/', got 'relative/assets'",
        "BASE_RESPONSE_DIR: must be a path starting with '/', got 'relative/responses'",
        "NVCF_TELEMETRY_EXPORTS: must be an object keyed by traces, metrics, logs",
        # Unset, they are the same directories (BASE_*), and say so under their own names.
        "INFERENCE_ASSET_DIR: must be a path starting with '/', got 'relative/assets'",
        "INFERENCE_RESPONSE_DIR: must be a path starting with '/', got 'relative/responses'",
    ]
    assert sorted(lines) == sorted(expected)


def test_blank_values_count_as_unset() -> None:
    config = WorkerConfig.from_env({**BASE, env.INFERENCE_PORT: " ", env.MAX_REQUEST_CONCURRENCY: ""})
    assert (config.inference_port, config.max_concurrency) == (8000, 1)
    with pytest.raises(WorkerConfigError, match="NVCF_WORKER_TOKEN: is required"):
        WorkerConfig.from_env({**BASE, env.NVCF_WORKER_TOKEN: "  "})


def test_null_written_for_an_optional_setting_is_unset() -> None:
    """``null`` reads as unset, and the setting's check is not run on it (it used to crash on None)."""
    config = WorkerConfig.from_env({**BASE, env.NVCF_TELEMETRY_EXPORTS: "null", env.NVCF_FQDN_GRPC_CA: "~"})
    assert (config.telemetry_exports, config.grpc_ca) == (None, None)


def test_the_address_file_wins_while_it_holds_an_address(tmp_path: Path) -> None:
    from nvcf_mono.worker import endpoint

    address_file = tmp_path / "grpc-address"
    assert endpoint.current("127.0.0.1:5000", str(address_file)) == ("127.0.0.1", 5000)  # no file yet
    address_file.write_text("127.0.0.1:6000\n")
    assert endpoint.current("127.0.0.1:5000", str(address_file)) == ("127.0.0.1", 6000)
    address_file.write_text("garbage")
    assert endpoint.current("127.0.0.1:5000", str(address_file)) == ("127.0.0.1", 5000)
    assert endpoint.current("[::1]:7000", None) == ("::1", 7000)
