"""One render or validation request, start to end (reference helm-validation §2.4 and §3).

Input checks, render (release ``mini-service``, hooks never rendered, CRDs skipped), decode limits,
the kind check per policy, then for the ``Default`` policy sanitization and the object rules.
Validation failures are results (``valid: false``), never exceptions.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

import attrs

from nvcf_mono.contracts import pull_credentials
from nvcf_mono.helm import HelmRenderError, RegistryCredential, RenderedChart, RenderRequest
from nvcf_mono.reval.inputs import chart_url_errors, is_local_chart, kube_version_error
from nvcf_mono.reval.objects import ExtraType, Obj, decode_errors, pod_spec, unsupported_types
from nvcf_mono.reval.rules import object_errors, target_service_errors
from nvcf_mono.reval.sanitize import SanitizeSettings, sanitize
from nvcf_mono.structure import WireModel, wire

RELEASE = "mini-service"
DEFAULT, UNRESTRICTED = "Default", "Unrestricted"
#: Appended to security-context problems that are reported but not enforced.
NOT_ENFORCED = " (not enforced yet)"


class ChartRendering(Protocol):
    async def render(self, request: RenderRequest) -> RenderedChart: ...


class ImageChecking(Protocol):
    async def check(self, images: Iterable[str], secrets: Sequence[Mapping[str, RegistryCredential]]) -> list[str]:
        """What is wrong with ``images`` (none: every one exists in its registry)."""
        ...


@wire
class ExtraKubernetesType(WireModel):
    group: str = ""
    version: str = ""
    kind: str = ""
    resource: str = ""


@wire
class ValidationPolicy(WireModel):
    """``{id, name: Default|Unrestricted, allowedExtraKubernetesTypes}``."""

    id: str | None = None
    name: str | None = None
    allowed_extra_kubernetes_types: tuple[ExtraKubernetesType, ...] = ()


@wire
class RevalRequest(WireModel):
    """Body of ``/v1/validate`` and ``/v1/render`` (NVCF's ``RevalRequest``)."""

    helm_chart: str | None = None
    namespace: str | None = None
    release_name: str | None = None
    helm_chart_service_port: int | None = None
    helm_chart_service_name: str | None = None
    helm_chart_http_health_endpoint: str | None = None
    instance_type: str | None = None
    gpu: str | None = None
    max_instances: int | None = None
    min_instances: int | None = None
    configuration: Any = None
    k8s_version: str | None = None
    api_versions: tuple[str, ...] | None = None
    helm_registry_auth_config: Any = None
    #: A legacy NGC key, tried (as user ``$oauthtoken``) on NGC chart hosts and nvcr.io images first.
    api_key: str | None = attrs.field(default=None, repr=False)
    image_registry_auth_config: Any = None
    validation_policy: ValidationPolicy | None = None
    validation_policies: tuple[ValidationPolicy, ...] | None = None
    validate_images: bool | None = None


@wire
class PolicyResult(WireModel):
    id: str
    valid: bool
    validation_errors: tuple[str, ...] = ()


@wire
class RevalResult(WireModel):
    """``{valid, validationErrors, validationPolicies?, output?}`` plus the rules reported but not enforced."""

    valid: bool
    validation_errors: tuple[str, ...] = ()
    validation_policies: tuple[PolicyResult, ...] | None = None
    output: tuple[dict[str, Any], ...] | None = None
    warnings: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


class RequestError(ValueError):
    """The request is malformed (HTTP 400): the message says what to fix."""


@attrs.frozen(kw_only=True)
class ValidatorSettings:
    """How strictly charts are checked."""

    #: Security-context rules fail a chart (True), or are only reported as warnings.
    enforce_security_context: bool = False
    sanitize: SanitizeSettings = attrs.field(factory=SanitizeSettings)
    #: Charts may be local directories or archives (development), not only https/oci URLs.
    allow_local_charts: bool = False
    #: Kinds allowed besides the built-in ones by every policy (MiniService extensions' kinds).
    extra_types: tuple[ExtraType, ...] = ()
    #: Check that the chart's images exist (Default policy), unless the request's ``validateImages`` says.
    validate_images: bool = False


def check_request(req: RevalRequest, *, render: bool) -> list[ValidationPolicy]:
    """The bind rules (RequestError); the policies that apply."""
    if not req.helm_chart:
        raise RequestError("helmChart is required")
    if render:
        policies = [req.validation_policy] if req.validation_policy is not None else []
    else:
        policies = list(req.validation_policies or ())
        for i, policy in enumerate(policies):
            if not policy.id:
                raise RequestError(f"validation policy {i} is missing ID")
    for policy in policies:
        if policy.name not in (None, "", DEFAULT, UNRESTRICTED):
            raise RequestError(f"unexpected name {policy.name!r} of a validation policy: use Default or Unrestricted")
        for i, extra in enumerate(policy.allowed_extra_kubernetes_types):
            for field in ("group", "version", "kind"):
                if not getattr(extra, field):
                    raise RequestError(f"allowed extra Kubernetes type {i} {field} is unset")
    if req.configuration is not None and not isinstance(req.configuration, Mapping):
        raise RequestError("configuration must be a JSON object of Helm values")
    return policies


#: Hosts a legacy NGC ``apiKey`` is tried on (as user ``$oauthtoken``): charts, and images.
_NGC_CHARTS = re.compile(r"(?:.+\.)?ngc\.nvidia\.com")
_NGC_IMAGES = re.compile(r"(?:.+\.)?nvcr\.io")


def credentials_for(
    auth_config: Any, chart: str, api_key: str | None = None
) -> dict[str, tuple[RegistryCredential, ...]]:
    """The chart host's credentials in ReVal's order: the legacy ``apiKey`` (an NGC host), then each secret
    of ``{k8sSecrets: [{auths: {host: {auth}}}]}`` that names the host.
    """
    host = urlsplit(chart).netloc.rsplit("@", 1)[-1].lower() if "://" in chart else ""  # as ChartSource.host
    if not host:
        return {}
    found: list[RegistryCredential] = []
    if api_key and _NGC_CHARTS.fullmatch(host.split(":", 1)[0]):
        found.append(RegistryCredential(username=pull_credentials.NGC_USER, password=api_key))
    for secret in secrets_of(auth_config, host):
        found += [credential for credential in secret.values() if credential not in found]
    return {host: tuple(found)} if found else {}


def secrets_of(auth_config: Any, host: str | None = None) -> list[dict[str, RegistryCredential]]:
    """Each secret of ``{k8sSecrets: [{auths: {host: {auth}}}]}`` as host -> credential, in order (only
    ``host``'s entries when given, matched as :func:`~nvcf_mono.contracts.pull_credentials.auths_in` does).
    """
    out: list[dict[str, RegistryCredential]] = []
    secrets = auth_config.get("k8sSecrets") if isinstance(auth_config, Mapping) else None
    for secret in secrets if isinstance(secrets, list) else []:
        found = {}
        for name, entry in pull_credentials.auths_in({"k8sSecrets": [secret]}, host).items():
            pair = pull_credentials.basic(entry)
            if pair is not None:
                found[name] = RegistryCredential(username=pair[0], password=pair[1])
        out.append(found)
    return out


def images_of(objects: Iterable[Obj]) -> set[str]:
    """The images of every workload's containers and init containers."""
    found: set[str] = set()
    for obj in objects:
        spec = pod_spec(obj) or {}
        for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            image = container.get("image") if isinstance(container, Mapping) else None
            if isinstance(image, str):
                found.add(image)
    return found


def _path(chart: str) -> str:
    return urlsplit(chart).path if chart.startswith("file://") else chart


class Validator:
    """Renders and validates charts with a renderer and settings."""

    def __init__(
        self,
        renderer: ChartRendering,
        settings: ValidatorSettings,
        rng: random.Random | None = None,
        *,
        images: ImageChecking | None = None,
    ) -> None:
        self._renderer = renderer
        self._settings = settings
        self._rng = rng or random.Random()
        self._images = images

    @property
    def validates_images(self) -> bool:
        """Whether a request that does not say checks the chart's images."""
        return self._settings.validate_images

    async def validate(self, req: RevalRequest) -> RevalResult:
        return await self._run(req, render=False)

    async def render(self, req: RevalRequest) -> RevalResult:
        return await self._run(req, render=True)

    async def _run(self, req: RevalRequest, *, render: bool) -> RevalResult:
        policies = check_request(req, render=render)
        chart = req.helm_chart or ""
        errors: list[str] = []
        if is_local_chart(chart) and self._settings.allow_local_charts:
            chart = _path(chart)
        else:
            errors += chart_url_errors(chart)
        version_error = kube_version_error(req.k8s_version)
        if version_error:
            errors.append(version_error)
        if errors:
            return _invalid(errors, render)
        namespace = req.namespace or req.release_name or RELEASE
        try:
            rendered = await self._renderer.render(
                RenderRequest(
                    chart=chart,
                    values=dict(req.configuration or {}),
                    release=RELEASE,
                    namespace=namespace,
                    credentials=credentials_for(req.helm_registry_auth_config, chart, req.api_key),
                )
            )
        except HelmRenderError as err:
            return _invalid([f"run helm template: {err}"], render)
        objects = [dict(o) for o in rendered.objects]
        skipped = tuple(str(s) for s in rendered.skipped)
        if "-" in rendered.chart_version:
            # NVCA parses <name>-<version>.tgz at the last '-' (reference compute-plane §5).
            return _invalid([f"Helm chart version {rendered.chart_version!r} must not contain '-'"], render)
        problems = decode_errors(objects)
        if problems:
            return _invalid(problems, render, skipped=skipped)
        target = (
            (req.helm_chart_service_name, req.helm_chart_service_port)
            if req.helm_chart_service_name and req.helm_chart_service_port
            else None
        )
        applied = policies[:1] if render or not policies else policies
        image_errors: list[str] = []
        wanted = self._settings.validate_images if req.validate_images is None else req.validate_images
        if wanted and any(p.name != UNRESTRICTED for p in applied or [ValidationPolicy(name=DEFAULT)]):
            if self._images is None:
                image_errors = ["the chart's images cannot be checked here"]
            else:
                images = images_of(objects)
                secrets = secrets_of(req.image_registry_auth_config)
                if req.api_key:
                    legacy = RegistryCredential(username=pull_credentials.NGC_USER, password=req.api_key)
                    ngc = {pull_credentials.image_registry(i) for i in images}
                    secrets.insert(0, {h: legacy for h in ngc if _NGC_IMAGES.fullmatch(h.split(":", 1)[0])})
                image_errors = await self._images.check(images, secrets)
        if render or not policies:
            policy = policies[0] if policies else ValidationPolicy(name=DEFAULT)
            valid, errs, warnings, out = self._policy(objects, policy, target, image_errors)
            return RevalResult(
                valid=valid,
                validation_errors=tuple(errs),
                output=tuple(out) if render and valid else (() if render else None),
                warnings=tuple(warnings),
                skipped=skipped,
            )
        results = []
        warnings_all: list[str] = []
        for policy in policies:
            valid, errs, warnings, _ = self._policy(objects, policy, target, image_errors)
            results.append(PolicyResult(id=policy.id or "", valid=valid, validation_errors=tuple(errs)))
            warnings_all += [w for w in warnings if w not in warnings_all]
        return RevalResult(
            valid=any(r.valid for r in results),
            validation_policies=tuple(results),
            warnings=tuple(warnings_all),
            skipped=skipped,
        )

    def _policy(
        self,
        objects: Sequence[Obj],
        policy: ValidationPolicy,
        target: tuple[str | None, int | None] | None,
        image_errors: Sequence[str],
    ) -> tuple[bool, list[str], list[str], list[Obj]]:
        """(valid, errors, warnings, output objects) of one policy; ``image_errors`` count for Default only."""
        extras = [
            ExtraType(group=e.group, version=e.version, kind=e.kind, resource=e.resource)
            for e in policy.allowed_extra_kubernetes_types
        ]
        kinds = unsupported_types(objects, [*self._settings.extra_types, *extras])
        if kinds is not None:
            return False, [kinds], [], []
        if policy.name == UNRESTRICTED:
            return True, [], [], list(objects)
        cleaned = sanitize(objects, self._settings.sanitize, self._rng)
        hard, security = object_errors(cleaned)
        if target is not None and not extras:  # a policy's extra kinds may serve the target (ReVal's rule)
            name, port = target
            hard += target_service_errors(list(objects), str(name), int(port or 0))
        hard += image_errors
        warnings: list[str] = []
        if self._settings.enforce_security_context:
            hard += security
        else:
            warnings = [s + NOT_ENFORCED for s in security]
        errors = sorted(hard)
        return not errors, errors, warnings, cleaned


def _invalid(errors: Sequence[str], render: bool, skipped: tuple[str, ...] = ()) -> RevalResult:
    return RevalResult(
        valid=False, validation_errors=tuple(sorted(errors)), output=() if render else None, skipped=skipped
    )
