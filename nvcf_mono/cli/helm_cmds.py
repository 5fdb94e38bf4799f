"""``nvcf-mono helm render CHART``: what a Helm chart renders to, as the platform would install it."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import anyio
import yaml

from nvcf_mono.cli.client import read_input
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.contracts.egress import servers_problem
from nvcf_mono.helm import (
    AUTO,
    HelmRenderError,
    RegistryCredential,
    RenderedChart,
    RendererOptions,
    RenderRequest,
    render_chart,
)
from nvcf_mono.helm.source import chart_source
from nvcf_mono.mappings import deep_merged

_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def register(sub: Any) -> None:
    """Add ``helm`` and its subcommands."""
    helm = sub.add_parser("helm", help=help_of("helm"))
    cmds = helm.add_subparsers(dest="helm_command", metavar="SUBCOMMAND", required=True)
    render = cmds.add_parser(
        "render",
        help="print the Kubernetes objects a chart renders to (hooks and CRDs are left out)",
        description="Render a chart (a directory, a .tgz, an oci:// reference or an https:// URL) and print its "
        "objects as YAML documents, in install order. Helm hooks and CRDs are never installed by the platform: "
        "they are listed on stderr instead.",
    )
    render.add_argument("chart", help="chart directory, .tgz archive, oci://host/path/name[:tag] or https:// URL")
    render.add_argument(
        "-f",
        "--values",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML values file ('-': standard input); repeat to layer files (later ones win, mappings merge)",
    )
    render.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="sets",
        help="one value, e.g. --set image.tag=v2 (true, false, null and integers are typed, the rest is text; "
        "applied after --values)",
    )
    render.add_argument("--release", default="release", metavar="NAME", help="release name (default: release)")
    render.add_argument("--namespace", default="default", metavar="NS", help="namespace (default: default)")
    render.add_argument(
        "--renderer",
        choices=(AUTO, "binary", "sdk"),
        default=AUTO,
        help="binary: the helm executable; sdk: helm-python-sdk in process; auto (default): binary if found",
    )
    _fetching_arguments(render)
    render.add_argument("--username", metavar="USER", help="registry or chart-host user (with --password-file)")
    render.add_argument("--password-file", metavar="FILE", help="file holding that user's password ('-': stdin)")
    render.add_argument("--json", action="store_true", help="one JSON document: chart, objects and skipped")
    render.set_defaults(func=_render)

    validate = cmds.add_parser(
        "validate",
        help="check a chart against the rules of Helm functions and tasks, as the platform does",
        description="Render a chart and check it with the platform's validator (NVCF's ReVal rules: allowed kinds, "
        "at most 300 objects, volume types, ClusterIP services, the target service and port, security contexts). "
        "Local directories and archives are accepted here. Exit 0 when valid, 1 when not.",
    )
    validate.add_argument("chart", help="chart directory, .tgz archive, oci://host/path/name[:tag] or https:// URL")
    validate.add_argument(
        "-f", "--values", action="append", default=[], metavar="FILE", help="YAML values file ('-': stdin; repeatable)"
    )
    validate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets", help="one value")
    validate.add_argument("--service-name", metavar="NAME", help="helmChartServiceName: the Service the worker calls")
    validate.add_argument("--service-port", type=int, metavar="PORT", help="inferencePort: that Service's port")
    validate.add_argument(
        "--enforce-security-context",
        action="store_true",
        help="fail on security-context rules (default: report them as warnings, 'not enforced yet')",
    )
    validate.add_argument(
        "--validate-images",
        action="store_true",
        help="check that the chart's images exist in their registries (anonymously: public images only)",
    )
    validate.add_argument(
        "--renderer", choices=(AUTO, "binary", "sdk"), default=AUTO, help="how to render (default: auto)"
    )
    _fetching_arguments(validate)
    validate.add_argument("--json", action="store_true", help="the validator's answer as JSON")
    validate.set_defaults(func=_validate)


def _fetching_arguments(parser: argparse.ArgumentParser) -> None:
    """How both subcommands render: the helm executable, the deadline, what registries need."""
    parser.add_argument("--helm-binary", type=Path, metavar="PATH", help="the helm executable (default: helm on PATH)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="deadline (default 60)")
    parser.add_argument("--ca-file", type=Path, metavar="FILE", help="CA bundle trusted for charts and registries")
    parser.add_argument(
        "--plain-http-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        dest="plain_http",
        help="an OCI registry reached over plain http instead of https (the chart's, and the images checked in it); "
        "repeat for each server it sends you to, such as its blob storage (plugins.helm.plain_http_registries)",
    )


def _options(args: argparse.Namespace, ctx: CliContext) -> RendererOptions:
    """The renderer's options from the flags both subcommands share."""
    if args.timeout <= 0:
        raise CliError("--timeout must be a positive number of seconds")
    if (problem := servers_problem(args.plain_http)) is not None:
        raise CliError(f"--plain-http-registry: {problem}")
    return RendererOptions(
        binary=args.helm_binary,
        environ=ctx.environ,
        timeout=args.timeout,
        ca_file=args.ca_file,
        plain_http=tuple(args.plain_http),  # the fetcher compares them in lower case
    )


def _render(args: argparse.Namespace, ctx: CliContext) -> int:
    options = _options(args, ctx)
    values = _values(args.values, args.sets, ctx)
    request = RenderRequest(
        chart=args.chart,
        values=values,
        release=args.release,
        namespace=args.namespace,
        credentials=_credentials(args, ctx),
    )
    try:
        result = anyio.run(_run, request, args.renderer, options)
    except HelmRenderError as err:
        raise CliError(str(err), code=1) from err
    for skipped in result.skipped:
        print(f"skipped {skipped}", file=ctx.stderr)
    print(
        f"chart {result.chart_name} {result.chart_version} ({result.renderer} renderer): "
        f"{_count(len(result.objects), 'object')}, {len(result.skipped)} skipped",
        file=ctx.stderr,
    )
    if args.json:
        print(json.dumps(_as_json(result), indent=2), file=ctx.stdout)
    elif result.objects:
        ctx.stdout.write(yaml.safe_dump_all(result.objects, sort_keys=False, explicit_start=True))
    return 0


async def _run(request: RenderRequest, renderer: str, options: RendererOptions) -> RenderedChart:
    return await render_chart(request, renderer=renderer, options=options)


def _as_json(result: RenderedChart) -> dict[str, Any]:
    return {
        "chart": {"name": result.chart_name, "version": result.chart_version},
        "renderer": result.renderer,
        "objects": list(result.objects),
        "skipped": [{"source": s.source, "kind": s.kind, "name": s.name, "reason": s.reason} for s in result.skipped],
    }


def _credentials(args: argparse.Namespace, ctx: CliContext) -> dict[str, tuple[RegistryCredential, ...]]:
    if args.username is None and args.password_file is None:
        return {}
    if args.username is None or args.password_file is None:
        raise CliError("--username and --password-file go together")
    try:
        host = chart_source(args.chart).host
    except HelmRenderError as err:
        raise CliError(str(err), code=1) from err
    if host is None:
        raise CliError("--username applies to oci:// and https:// charts only")
    raw = read_input("--password-file", args.password_file, ctx)
    try:
        password = raw.decode().strip()
    except UnicodeDecodeError:
        raise CliError(f"--password-file {args.password_file}: not UTF-8 text") from None
    return {host: (RegistryCredential(args.username, password),)}


def _values(files: list[str], sets: list[str], ctx: CliContext) -> dict[str, Any]:
    """Values files deep-merged in order, then each --set."""
    values: dict[str, Any] = {}
    for path in files:
        try:
            loaded = yaml.safe_load(read_input("-f", path, ctx))
        except yaml.YAMLError as err:
            raise CliError(f"values file {path} is not valid YAML: {' '.join(str(err).split())}") from err
        if loaded is None:
            continue
        if not isinstance(loaded, dict):
            raise CliError(f"values file {path} must hold a mapping, not a {type(loaded).__name__}")
        values = deep_merged(values, loaded)
    for item in sets:
        key, sep, text = item.partition("=")
        keys = key.strip().split(".")
        if not sep or not all(part.strip() for part in keys):
            raise CliError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. --set image.tag=v2")
        node = values
        for part in keys[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[keys[-1]] = _typed(text)
    return values


def _typed(text: str) -> Any:
    """Like helm's --set: booleans, null and integers are typed; everything else is text."""
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if _INTEGER.fullmatch(text):
        return int(text)
    return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _Rendering:
    """The CLI's renderer, as the validator takes it."""

    def __init__(self, renderer: str, options: RendererOptions) -> None:
        self._renderer, self._options = renderer, options

    async def render(self, request: RenderRequest) -> RenderedChart:
        return await render_chart(request, renderer=self._renderer, options=self._options)


def _validate(args: argparse.Namespace, ctx: CliContext) -> int:
    from nvcf_mono.helm.images import ImageChecker
    from nvcf_mono.reval.engine import RequestError, RevalRequest, Validator, ValidatorSettings
    from nvcf_mono.structure import unstructure

    if (args.service_name is None) != (args.service_port is None):
        raise CliError("--service-name and --service-port go together")
    options = _options(args, ctx)
    settings = ValidatorSettings(
        enforce_security_context=args.enforce_security_context,
        allow_local_charts=True,
        validate_images=args.validate_images,
    )
    rendering = _Rendering(args.renderer, options)
    request = RevalRequest(
        helm_chart=args.chart,
        helm_chart_service_name=args.service_name,
        helm_chart_service_port=args.service_port,
        configuration=_values(args.values, args.sets, ctx) or None,
    )
    try:
        result = anyio.run(Validator(rendering, settings, images=ImageChecker(options)).validate, request)
    except RequestError as err:
        raise CliError(str(err)) from err
    if args.json:
        print(json.dumps(unstructure(result, omit_none=True), indent=2), file=ctx.stdout)
    else:
        print(f"{args.chart}: {'valid' if result.valid else 'invalid'}", file=ctx.stdout)
        for error in result.validation_errors:
            print(f"  error: {error}", file=ctx.stdout)
        for warning in result.warnings:
            print(f"  warning: {warning}", file=ctx.stdout)
        for skipped in result.skipped:
            print(f"  skipped: {skipped}", file=ctx.stdout)
    return 0 if result.valid else 1
