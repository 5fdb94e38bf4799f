"""A chart's images checked in their registry (ReVal's ``validateImages``) through the platform: the
validator API with the request's image secrets, and function creation with the account's CONTAINER
registry credentials when the operator turns the check on. The registry is the tests' own over TLS
(``tests/unit/helm/oci_registry.py``).
"""

from __future__ import annotations

import base64
from pathlib import Path

from nvcf_mono.helm.images import NO_CREDENTIAL
from nvcf_mono.testing.running import platform
from tests.function_charts import VALUES, write_chart
from tests.unit.helm.https_server import issue_tls
from tests.unit.helm.oci_registry import PASSWORD, USER, Registry, running

IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
LOCAL = {"plugins.control.helm.allow_local_charts": "true"}


def _registry() -> Registry:
    registry = Registry(public={"acme/public"})
    for repository in ("acme/public", "acme/private"):
        registry.push(repository, "1.0", b"layer of " + repository.encode(), config_type=IMAGE_CONFIG)
    return registry


def _settings(ca_file: Path, **more: str) -> dict[str, str]:
    return {
        **LOCAL,
        "plugins.helm.ca_file": str(ca_file),
        "plugins.helm.chart_networks": '["127.0.0.1/32"]',
        **more,
    }


def _request(chart: Path, image: str, **extra: object) -> dict[str, object]:
    return {
        "helmChart": str(chart),
        "helmChartServiceName": "inference-svc",
        "helmChartServicePort": 8001,
        "configuration": {"image": image},
        **extra,
    }


async def test_validate_images_asks_the_registry_with_the_requests_secrets(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    chart = write_chart(tmp_path / "chart")
    async with running(_registry(), context) as registry:
        host = registry.base.removeprefix("https://").replace("127.0.0.1", "localhost")
        private = f"{host}/acme/private:1.0"
        async with platform(tmp_path / "p", **_settings(ca_file)) as p:
            # Not asked for, and off on the server (as NVCF's ReVal is deployed): nothing is checked.
            reply = await p.admin.post("/v1/validate", _request(chart, private))
            assert reply.json["valid"] is True, reply.body
            assert not registry.requests
            reply = await p.admin.post("/v1/validate", _request(chart, private, validateImages=True))
            assert (reply.json["valid"], reply.json["validationErrors"]) == (False, [NO_CREDENTIAL + private])
            auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            secrets = {
                "k8sSecrets": [
                    {"auths": {"elsewhere.example.com": {"auth": "eDp5"}}},
                    {"auths": {host: {"auth": auth}}},
                ]
            }
            reply = await p.admin.post(
                "/v1/validate", _request(chart, private, validateImages=True, imageRegistryAuthConfig=secrets)
            )
            assert reply.json["valid"] is True, reply.body
            reply = await p.admin.post("/v1/render", _request(chart, f"{host}/acme/public:9.9", validateImages=True))
            assert reply.json["valid"] is False
            (error,) = reply.json["validationErrors"]
            assert error.startswith(f"cannot check image {host}/acme/public:9.9: it is not in its registry (HTTP 404")
            # Only the Default policy checks images.
            unrestricted = [{"id": "u", "name": "Unrestricted"}, {"id": "d", "name": "Default"}]
            reply = await p.admin.post(
                "/v1/validate", _request(chart, private, validateImages=True, validationPolicies=unrestricted)
            )
            assert reply.json["valid"] is True
            verdicts = {r["id"]: (r["valid"], r.get("validationErrors", [])) for r in reply.json["validationPolicies"]}
            assert verdicts == {"u": (True, []), "d": (False, [NO_CREDENTIAL + private])}


async def test_function_creation_checks_images_with_the_accounts_registry_credentials(tmp_path: Path) -> None:
    ca_file, context = issue_tls(tmp_path)
    async with running(_registry(), context) as registry:
        host = registry.base.removeprefix("https://").replace("127.0.0.1", "localhost")
        chart = write_chart(tmp_path / "chart", values={**VALUES, "image": f"{host}/acme/private:1.0"})
        function = {
            "name": "chart",
            "inferenceUrl": "/infer",
            "inferencePort": 8001,
            "helmChart": str(chart),
            "helmChartServiceName": "inference-svc",
        }
        checks = _settings(ca_file, **{"plugins.control.helm.validate_images": "true"})
        async with platform(tmp_path / "p", **checks) as p:
            refused = await p.admin.post("/v2/nvcf/functions", function)
            assert refused.status == 400, refused.body
            assert refused.json["validationErrors"] == [NO_CREDENTIAL + f"{host}/acme/private:1.0"]
            secret = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            added = await p.admin.post(
                "/v2/nvcf/registry-credentials",
                {
                    "registryHostname": host,
                    "secret": {"name": "robot", "value": secret},
                    "artifactTypes": ["CONTAINER"],
                },
            )
            assert added.status == 200, added.body
            made = await p.admin.post("/v2/nvcf/functions", function)
            assert made.status == 200, made.body
