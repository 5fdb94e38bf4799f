"""Helm charts of functions and tasks, checked by the control plane with the validator (``nvcf_mono.reval``):
at creation (the chart as it comes) and at deployment (with the deployment's ``configuration`` values).
An invalid chart is a 400 whose ``validationErrors`` carry NVCF's texts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nvcf_mono.auth.secret import Keyring
from nvcf_mono.contracts import pull_credentials
from nvcf_mono.helm import HelmRenderError, RenderedChart, RenderRequest
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.planes.control.config import ChartChecks
from nvcf_mono.planes.control.registry import all_pull_credentials, chart_credentials_for
from nvcf_mono.planes.control.store import ControlStore
from nvcf_mono.reval.engine import RevalRequest, RevalResult, Validator, ValidatorSettings
from nvcf_mono.reval.objects import ExtraType
from nvcf_mono.reval.sanitize import SanitizeSettings


class NoRenderer:
    """Where no renderer is configured on this node (the ``helm`` plugin is not enabled)."""

    async def render(self, request: RenderRequest) -> RenderedChart:
        raise HelmRenderError("Helm charts cannot be rendered on this node: enable the 'helm' plugin")


def validator_settings(checks: ChartChecks, extra_types: Sequence[ExtraType] = ()) -> ValidatorSettings:
    return ValidatorSettings(
        enforce_security_context=checks.enforce_security_context,
        allow_local_charts=checks.allow_local_charts,
        extra_types=tuple(extra_types),
        validate_images=checks.validate_images,
        sanitize=SanitizeSettings(
            preserve_labels=checks.preserve_labels, preserve_annotations=checks.preserve_annotations
        ),
    )


def helm_auth(store: ControlStore, keyring: Keyring, nca_id: str, chart: str) -> dict[str, Any] | None:
    """The account's HELM credential for the chart's host as ``{k8sSecrets: [{auths: {host: {auth}}}]}``."""
    value = chart_credentials_for(store, keyring, nca_id, chart)
    return pull_credentials.decode(value) if value is not None else None


def image_auth(store: ControlStore, keyring: Keyring, nca_id: str) -> dict[str, Any] | None:
    """The account's CONTAINER credentials, for a chart's images, in the same form."""
    value = all_pull_credentials(store, keyring, nca_id)
    return pull_credentials.decode(value) if value is not None else None


def invalid(what: str, result: RevalResult) -> ProblemError:
    errors = list(result.validation_errors) or [
        e for p in result.validation_policies or () for e in p.validation_errors
    ]
    return ProblemError(
        400,
        f"{what} is not a valid Helm function chart: " + "; ".join(errors),
        extra={"validationErrors": errors},
    )


async def check_chart(
    validator: Validator,
    *,
    chart: str,
    service_name: str | None,
    service_port: int | None,
    configuration: Mapping[str, Any] | None,
    account: tuple[ControlStore, Keyring, str],
    what: str,
) -> RevalResult:
    """Validate with the ``account``'s (store, keyring, id) credentials; raises the 400 when the chart is invalid."""
    store, keyring, nca_id = account
    auth = helm_auth(store, keyring, nca_id, chart)
    images = image_auth(store, keyring, nca_id) if validator.validates_images else None
    result = await validator.validate(
        RevalRequest(
            helm_chart=chart,
            helm_chart_service_name=service_name,
            helm_chart_service_port=service_port,
            configuration=dict(configuration) if configuration else None,
            helm_registry_auth_config=dict(auth) if auth else None,
            image_registry_auth_config=dict(images) if images else None,
        )
    )
    if not result.valid:
        raise invalid(what, result)
    return result
