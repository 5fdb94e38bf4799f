"""What the validator asks the image checker: every workload's images, the request's secrets in order, a
legacy NGC key first for nvcr.io images, and only when the request (or the server) wants it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nvcf_mono.helm import RegistryCredential, RenderedChart, RenderRequest
from nvcf_mono.reval.engine import RevalRequest, Validator, ValidatorSettings

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}


class Chart:
    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = objects

    async def render(self, request: RenderRequest) -> RenderedChart:
        return RenderedChart(chart_name="c", chart_version="1.0.0", objects=self.objects, skipped=(), renderer="t")


class Images:
    def __init__(self) -> None:
        self.asked: list[tuple[set[str], list[dict[str, RegistryCredential]]]] = []

    async def check(self, images: Iterable[str], secrets: Sequence[Mapping[str, RegistryCredential]]) -> list[str]:
        self.asked.append((set(images), [dict(s) for s in secrets]))
        return ["image trouble"]


def _job(*images: str) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": image} for i, image in enumerate(images)]
    template = {"spec": {"initContainers": containers[:1], "containers": containers[1:]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": template}}


async def test_the_validator_asks_for_every_workloads_images_with_the_secrets_in_order() -> None:
    images = Images()
    chart = Chart({**POD, "spec": {"containers": [{"name": "a", "image": "nvcr.io/acme/a:1"}]}}, _job("busybox", "b:2"))
    validator = Validator(chart, ValidatorSettings(allow_local_charts=True), images=images)
    request = RevalRequest(helm_chart="/chart")
    assert (await validator.validate(request)).valid is True and not images.asked  # off unless asked
    auth = {"k8sSecrets": [{"auths": {"nvcr.io": {"auth": base64.b64encode(b"u:p").decode()}}}]}
    asked = RevalRequest(helm_chart="/chart", validate_images=True, image_registry_auth_config=auth, api_key="nvapi-K")
    result = await validator.validate(asked)
    assert (result.valid, result.validation_errors) == (False, ("image trouble",))
    ((seen, secrets),) = images.asked
    assert seen == {"nvcr.io/acme/a:1", "busybox", "b:2"}
    assert secrets == [
        {"nvcr.io": RegistryCredential("$oauthtoken", "nvapi-K")},
        {"nvcr.io": RegistryCredential("u", "p")},
    ]
    # The server's setting turns it on; a request may still turn it off.
    on = Validator(chart, ValidatorSettings(allow_local_charts=True, validate_images=True), images=images)
    assert (await on.validate(RevalRequest(helm_chart="/chart"))).valid is False
    assert (await on.validate(RevalRequest(helm_chart="/chart", validate_images=False))).valid is True
