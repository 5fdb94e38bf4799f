"""Which node the CLI talks to, and with which credentials, from a state directory's endpoints.json."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from nvcf_mono.cli.client import add_api_options, connect
from nvcf_mono.cli.context import CliContext, CliError

CONTROL = "http://127.0.0.1:8080"
INVOCATION = "http://127.0.0.1:8090"


def _ctx(**environ: str) -> CliContext:
    return CliContext(environ=environ, stdout=io.StringIO(), stderr=io.StringIO(), run_host=lambda *_: 1)


def _args(state: Path, *flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_api_options(parser)
    return parser.parse_args(["--state-dir", str(state), *flags])


def _state(tmp_path: Path, **doc: Any) -> Path:
    (tmp_path / "endpoints.json").write_text(json.dumps({"version": 1, **doc}))
    return tmp_path


def test_management_goes_to_api_url_and_invocations_to_invocation_url_with_the_same_credentials(
    tmp_path: Path,
) -> None:
    state = _state(
        tmp_path, role="control", node_url=CONTROL, api_url=CONTROL, invocation_url=INVOCATION,
        credentials={"admin_token": "tok", "api_key": "key"},
    )  # fmt: skip
    management = connect(_args(state), _ctx())
    assert management.api_url == CONTROL and management.credential().value == "tok"
    invocation = connect(_args(state), _ctx(), invocation=True)
    assert invocation.api_url == INVOCATION and invocation.credential().value == "tok"


def test_a_node_that_knows_no_peer_says_which_setting_is_missing(tmp_path: Path) -> None:
    state = _state(tmp_path, role="compute", node_url="http://127.0.0.1:8095", api_url=None, invocation_url=None)
    with pytest.raises(CliError, match=r"compute node's .*peers\.invocation_url"):
        connect(_args(state), _ctx(), invocation=True)
    with pytest.raises(CliError, match=r"peers\.api_url"):
        connect(_args(state), _ctx())


def test_credentials_never_go_to_a_server_the_file_does_not_name(tmp_path: Path) -> None:
    state = _state(
        tmp_path, role="control", node_url=CONTROL, api_url=CONTROL, invocation_url=INVOCATION,
        credentials={"admin_token": "tok"},
    )  # fmt: skip
    with pytest.raises(CliError, match="no credentials for http://elsewhere:8080"):
        connect(_args(state, "--api-url", "http://elsewhere:8080"), _ctx(), invocation=True)
    # The invocation node named by the file is one of its own: its credentials go there.
    assert connect(_args(state, "--api-url", INVOCATION), _ctx()).credential().value == "tok"


def test_a_ca_file_that_cannot_be_read_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    url = "https://127.0.0.1:8443"
    state = _state(
        tmp_path, role="all-in-one", node_url=url, api_url=url, invocation_url=url,
        ca_file=".nvcf-mono/tls/ca.pem", credentials={"admin_token": "tok"},
    )  # fmt: skip
    with pytest.raises(CliError, match=r"cannot read the CA certificates to trust from \.nvcf-mono/tls/ca\.pem"):
        connect(_args(state), _ctx())
    (tmp_path / "garbage.pem").write_text("not a certificate")
    state = _state(
        tmp_path, role="all-in-one", node_url=url, api_url=url, invocation_url=url,
        ca_file=str(tmp_path / "garbage.pem"), credentials={"admin_token": "tok"},
    )  # fmt: skip
    with pytest.raises(CliError, match=r"garbage\.pem"):
        connect(_args(state), _ctx())
