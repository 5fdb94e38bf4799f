"""``nvcf-mono deploy create|get|update|remove``: run a function version on GPUs and watch it come up."""

from __future__ import annotations

import argparse
import time
from typing import Any

from nvcf_mono.cli.client import ApiClient, add_api_options, connect, csv_list, positive_float, read_json_object
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.function_cmds import ONLY_VERSION, only_version
from nvcf_mono.cli.output import cell, emit_json, fields, table
from nvcf_mono.cli.progress import Progress

DEPLOYMENTS = "/v2/nvcf/deployments"
DEFAULT_WAIT = 900.0
POLL_INTERVAL = 1.0


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _path(fid: str, vid: str) -> str:
    return f"{DEPLOYMENTS}/functions/{fid}/versions/{vid}"


def _pin_version(client: ApiClient, args: argparse.Namespace) -> str:
    """The deployment's path: of the version named, or of the function's only one."""
    return _path(args.function_id, only_version(client, args))


def register(sub: Any) -> None:
    """Add ``deploy`` and its subcommands."""
    deploy = sub.add_parser("deploy", help=help_of("deploy"))
    cmds = deploy.add_subparsers(dest="deploy_command", metavar="SUBCOMMAND")
    deploy.set_defaults(func=lambda args, ctx: (deploy.print_help(ctx.stdout), 2)[1])

    create = cmds.add_parser(
        "create",
        help="deploy a version and wait until it is ACTIVE (or ERROR)",
        description="Deploy a function version, then wait until it is ACTIVE (exit 0) or ERROR (exit 1), "
        "showing progress on stderr. Flags override the fields of --input-file.",
    )
    create.add_argument("function_id", metavar="FID")
    create.add_argument("version_id", metavar="VID", nargs="?", help=ONLY_VERSION)
    create.add_argument("--gpu", help="GPU model, e.g. H100")
    create.add_argument("--instance-type", metavar="TYPE", help="e.g. ON-PREM.GPU.H100_1x")
    create.add_argument("--min-instances", type=_count, metavar="N", help="default 1")
    create.add_argument("--max-instances", type=_count, metavar="N", help="default: the larger of 1 and the minimum")
    create.add_argument("--max-request-concurrency", type=_count, metavar="N", help="requests per instance (1)")
    where = create.add_mutually_exclusive_group()
    where.add_argument("--backend", help="cluster group to deploy on")
    where.add_argument("--clusters", type=csv_list, metavar="A,B", help="clusters to deploy on")
    create.add_argument("--regions", type=csv_list, metavar="A,B", help="regions to deploy in")
    create.add_argument("--attributes", type=csv_list, metavar="A,B", help="cluster attributes required")
    create.add_argument(
        "--input-file",
        metavar="FILE",
        help="the deployment JSON ({deploymentSpecifications: [...]}) or one specification",
    )
    create.add_argument("--no-wait", action="store_true", help="return once the deployment is accepted")
    create.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_WAIT,
        metavar="SECONDS",
        help=f"stop waiting after this long, exit 1 (default {DEFAULT_WAIT:g})",
    )
    add_api_options(create, timeout_flag="--http-timeout")
    create.set_defaults(func=_create)

    get = cmds.add_parser("get", help="show a version's deployment")
    get.add_argument("function_id", metavar="FID")
    get.add_argument("version_id", metavar="VID", nargs="?", help=ONLY_VERSION)
    add_api_options(get)
    get.set_defaults(func=_get)

    update = cmds.add_parser(
        "update",
        help="rescale a deployed gpu specification, or change its autoscaling",
        description="Change the minimum and maximum instances or the autoscaling policy of one gpu "
        "specification (PATCH, effective at once). The GPU, instance type and placement cannot change: "
        "remove and deploy again for that.",
    )
    update.add_argument("function_id", metavar="FID")
    update.add_argument("version_id", metavar="VID", nargs="?", help=ONLY_VERSION)
    update.add_argument("--spec-id", metavar="ID", help="the gpu specification (optional when there is one)")
    update.add_argument("--min-instances", type=_count, metavar="N")
    update.add_argument("--max-instances", type=_count, metavar="N")
    update.add_argument(
        "--autoscaling-policy",
        choices=("CUSTOM_CONFIGURATION", "PLATFORM_CONFIGURATION"),
        help="PLATFORM_CONFIGURATION drops the spec's own autoscaling configuration",
    )
    update.add_argument(
        "--autoscaling-file",
        metavar="FILE",
        help="the spec's autoscalingConfiguration as JSON: {scaleUpDetails: {factor, threshold, stickiness: "
        "{size, threshold}}, scaleDownDetails: {...}}",
    )
    add_api_options(update)
    update.set_defaults(func=_update)

    remove = cmds.add_parser(
        "remove", aliases=["undeploy"], help="remove a version's deployment (the version goes INACTIVE)"
    )
    remove.add_argument("function_id", metavar="FID")
    remove.add_argument("version_id", metavar="VID", nargs="?", help=ONLY_VERSION)
    remove.add_argument("--graceful", action="store_true", help="let queued requests finish first")
    add_api_options(remove)
    remove.set_defaults(func=_remove)


def _specs(args: argparse.Namespace, ctx: CliContext) -> list[dict[str, Any]]:
    specs: list[dict[str, Any]] = [{}]
    if args.input_file:
        doc = read_json_object("--input-file", args.input_file, ctx)
        listed = doc.get("deploymentSpecifications", [doc])
        if not isinstance(listed, list) or not listed or not all(isinstance(s, dict) for s in listed):
            raise CliError(f"--input-file {args.input_file}: 'deploymentSpecifications' must be a list of objects")
        specs = [dict(s) for s in listed]
    flags = {
        "gpu": args.gpu,
        "instanceType": args.instance_type,
        "minInstances": args.min_instances,
        "maxInstances": args.max_instances,
        "maxRequestConcurrency": args.max_request_concurrency,
        "backend": args.backend,
        "clusters": args.clusters,
        "regions": args.regions,
        "attributes": args.attributes,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if given and len(specs) > 1:
        raise CliError(
            f"--input-file {args.input_file} has {len(specs)} deployment specifications; flags can only "
            "override a file with one"
        )
    for spec in specs:
        spec.update(given)
        # A backend and clusters cannot both be given; the one on the command line wins.
        if "backend" in given:
            spec.pop("clusters", None)
        if "clusters" in given:
            spec.pop("backend", None)
        spec.setdefault("minInstances", 1)
        low = spec["minInstances"]
        spec.setdefault("maxInstances", max(low, 1) if isinstance(low, int) else 1)
        missing = [flag for flag, key in (("--gpu", "gpu"), ("--instance-type", "instanceType")) if not spec.get(key)]
        if missing:
            raise CliError(f"deploy create: {' and '.join(missing)} required (as flags or in --input-file)")
    return specs


def _create(args: argparse.Namespace, ctx: CliContext) -> int:
    specs = _specs(args, ctx)
    client = connect(args, ctx)
    path = _pin_version(client, args)
    doc = client.post(path, {"deploymentSpecifications": specs})
    status = doc["deployment"].get("functionStatus")
    if args.no_wait or status == "ACTIVE":
        _print_deployment(ctx, doc, args.json)
        return 0
    final = _wait(client, ctx, args, path)
    dep = final["deployment"]
    if dep.get("functionStatus") == "ERROR":
        if args.json:
            emit_json(ctx, final)
        lines = [f"deployment of function {args.function_id} version {args.version_id} failed: status ERROR"]
        lines += [f"  {line}" for line in _health_lines(dep)] or ["  (no health information was reported)"]
        lines.append(f"Remove it before deploying again: nvcf-mono deploy remove {args.function_id} {args.version_id}")
        raise CliError("\n".join(lines), 1)
    _print_deployment(ctx, final, args.json)
    return 0


def _wait(client: ApiClient, ctx: CliContext, args: argparse.Namespace, path: str) -> Any:
    """Poll the deployment until ACTIVE or ERROR; the last response."""
    started = time.monotonic()
    deadline = started + args.timeout
    progress = Progress(ctx.stderr, started)
    try:
        while True:
            remaining = deadline - time.monotonic()
            doc = client.get(path, management=True, timeout=max(1.0, min(args.http_timeout, remaining)))
            dep = doc["deployment"]
            progress.show(_describe(dep))
            status = dep.get("functionStatus")
            if status in ("ACTIVE", "ERROR"):
                return doc
            if status == "INACTIVE":
                raise CliError("the deployment was removed while waiting for it", 1)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CliError(
                    f"timed out after {args.timeout:g}s waiting for ACTIVE; last seen: {_describe(dep)}\n"
                    f"The deployment goes on: follow it with `nvcf-mono deploy get {args.function_id} "
                    f"{args.version_id}`, or remove it with `nvcf-mono deploy remove {args.function_id} "
                    f"{args.version_id}`.",
                    1,
                )
            time.sleep(min(POLL_INTERVAL, remaining))
    except KeyboardInterrupt:
        progress.close()
        print("stopped waiting; the deployment goes on", file=ctx.stderr)
        raise
    finally:
        progress.close()


def _describe(dep: dict[str, Any]) -> str:
    """``DEPLOYING  H100 ON-PREM.GPU.H100_1x: 1/2 running, 1 starting``: one line for the whole deployment."""
    parts = []
    for spec in dep.get("deploymentSpecifications") or []:
        p = spec.get("placement") or {}
        desired = p.get("desiredInstances", spec.get("minInstances"))
        text = f"{spec.get('gpu')} {spec.get('instanceType')}: {p.get('runningInstances', 0)}/{desired} running"
        if p.get("startingInstances"):
            text += f", {p['startingInstances']} starting"
        if p.get("waitingInstances"):
            text += f", {p['waitingInstances']} waiting"
        if p.get("waitingReason"):
            text += f" (waiting: {p['waitingReason']})"
        if p.get("failedInstances"):
            text += f", {p['failedInstances']} failed"
            if p.get("lastFailure"):
                text += f" (last: {p['lastFailure']})"
        parts.append(text)
    return f"{dep.get('functionStatus')}  " + "; ".join(parts)


def _health_lines(dep: dict[str, Any]) -> list[str]:
    """The deployment's failures, identical ones counted once."""
    counts: dict[str, int] = {}
    for info in dep.get("healthInfo") or []:
        # The error may quote what the instance printed: the function's own output.
        line = f"{info.get('gpu')} {info.get('instanceType')} on {info.get('backend')}: {cell(info.get('error'))}"
        counts[line] = counts.get(line, 0) + 1
    return [line + (f" (x{n})" if n > 1 else "") for line, n in counts.items()]


def _where(spec: dict[str, Any]) -> str:
    out = []
    if spec.get("backend"):
        out.append(f"backend {spec['backend']}")
    if spec.get("clusters"):
        out.append(f"clusters {','.join(spec['clusters'])}")
    if spec.get("regions"):
        out.append(f"regions {','.join(spec['regions'])}")
    if spec.get("attributes"):
        out.append(f"attributes {','.join(spec['attributes'])}")
    return "; ".join(out) or "any"


def _spec_table(ctx: CliContext, specs: list[dict[str, Any]]) -> None:
    rows = []
    for spec in specs:
        p = spec.get("placement") or {}
        rows.append(
            (
                spec.get("gpuSpecificationId"),
                spec.get("gpu"),
                spec.get("instanceType"),
                spec.get("minInstances"),
                spec.get("maxInstances"),
                spec.get("maxRequestConcurrency", 1),
                _where(spec),
                f"{p.get('runningInstances', 0)}/{p.get('desiredInstances', spec.get('minInstances'))}",
                p.get("startingInstances", 0),
                p.get("waitingInstances", 0),
            )
        )
    table(
        ctx,
        ("SPEC ID", "GPU", "INSTANCE TYPE", "MIN", "MAX", "CONCURRENCY", "WHERE", "RUNNING", "STARTING", "WAITING"),
        rows,
        empty="no gpu specifications",
    )


def _print_deployment(ctx: CliContext, doc: Any, as_json: bool) -> None:
    if as_json:
        emit_json(ctx, doc)
        return
    dep = doc["deployment"]
    fields(
        ctx,
        [
            ("function id", dep.get("functionId")),
            ("version id", dep.get("functionVersionId")),
            ("deployment id", dep.get("deploymentId")),
            ("function name", dep.get("functionName")),
            ("status", dep.get("functionStatus")),
            ("removal", "graceful: draining the queue" if dep.get("undeploying") else None),
            ("created", dep.get("createdAt")),
            ("updated", dep.get("lastUpdatedAt")),
        ],
    )
    print(file=ctx.stdout)
    _spec_table(ctx, dep.get("deploymentSpecifications") or [])
    _per_spec(ctx, dep, "waitingReason", "waiting (why):")
    _per_spec(ctx, dep, "autoscaler", "autoscaler (last decision, why):")
    health = _health_lines(dep)
    if health:
        print("\nfailures:", file=ctx.stdout)
        for line in health:
            print(f"  {line}", file=ctx.stdout)


def _per_spec(ctx: CliContext, dep: dict[str, Any], key: str, title: str) -> None:
    """One line per spec whose ``placement`` has ``key``, under ``title``."""
    lines = [
        (spec.get("gpuSpecificationId"), (spec.get("placement") or {}).get(key))
        for spec in dep.get("deploymentSpecifications") or []
    ]
    if any(text for _, text in lines):
        print(f"\n{title}", file=ctx.stdout)
        for spec_id, text in lines:
            if text:
                print(f"  {spec_id}: {cell(text)}", file=ctx.stdout)


def _get(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    doc = client.get(_pin_version(client, args), management=True)
    _print_deployment(ctx, doc, args.json)
    return 0


def _update(args: argparse.Namespace, ctx: CliContext) -> int:
    autoscaling = read_json_object("--autoscaling-file", args.autoscaling_file, ctx) if args.autoscaling_file else None
    given = (
        ("minInstances", args.min_instances),
        ("maxInstances", args.max_instances),
        ("autoscalingConfigurationPolicy", args.autoscaling_policy),
        ("autoscalingConfiguration", autoscaling),
    )
    body = {k: v for k, v in given if v is not None}
    if not body:
        raise CliError(
            "deploy update: give --min-instances, --max-instances, --autoscaling-policy and/or --autoscaling-file"
        )
    client = connect(args, ctx)
    dep = client.get(_pin_version(client, args), management=True)["deployment"]
    specs = dep.get("deploymentSpecifications") or []
    ids = [s.get("gpuSpecificationId") for s in specs]
    spec_id = args.spec_id
    if spec_id is None:
        if len(ids) != 1:
            raise CliError(
                f"deploy update: the deployment has {len(ids)} gpu specifications; pick one with --spec-id "
                f"({', '.join(map(str, ids))})"
            )
        spec_id = ids[0]
    doc = client.patch(f"{DEPLOYMENTS}/{dep['deploymentId']}/gpu-specifications/{spec_id}", body)
    if args.json:
        emit_json(ctx, doc)
    else:
        _spec_table(ctx, [doc["gpuSpecification"]])
    return 0


def _remove(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    doc = client.delete(_pin_version(client, args), query={"graceful": "true" if args.graceful else "false"})
    if args.json:
        emit_json(ctx, doc)
        return 0
    fn = doc["function"]
    if args.graceful:
        print(
            f"removing the deployment of function {args.function_id} version {args.version_id}: queued requests "
            f"finish first; status {fn.get('status')}",
            file=ctx.stdout,
        )
    else:
        print(
            f"removed the deployment of function {args.function_id} version {args.version_id}; status "
            f"{fn.get('status')}",
            file=ctx.stdout,
        )
    return 0
