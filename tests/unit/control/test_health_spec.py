"""A function's health spec: every field for an HTTP check; a gRPC check needs no uri or expected status."""

from __future__ import annotations

from typing import Any

import pytest

from nvcf_mono.models.function import Health, HealthProtocol
from nvcf_mono.structure import StructureError, structure


def test_a_grpc_check_needs_no_uri_or_expected_status() -> None:
    health = structure(Health, {"protocol": "gRPC", "port": 8001, "timeout": "PT10S"})
    assert health.protocol is HealthProtocol.GRPC
    assert (health.path, health.expected) == ("", 200)  # the whole server, SERVING


def test_a_grpc_check_may_name_its_service() -> None:
    assert structure(Health, {"protocol": "gRPC", "port": 8001, "timeout": "PT10S", "uri": "echo"}).path == "echo"


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"port": 8000, "timeout": "PT10S", "expectedStatusCode": 200}, "uri"),
        ({"port": 8000, "timeout": "PT10S", "uri": "/health"}, "expectedStatusCode"),
    ],
)
def test_an_http_check_still_needs_every_field(given: dict[str, Any], missing: str) -> None:
    with pytest.raises(StructureError, match=f"{missing}.*required for an HTTP health check"):
        structure(Health, {"protocol": "HTTP", **given})


def test_an_http_check_path_must_be_a_path() -> None:
    with pytest.raises(StructureError, match="uri"):
        structure(
            Health, {"protocol": "HTTP", "port": 8000, "timeout": "PT10S", "uri": "health", "expectedStatusCode": 200}
        )
