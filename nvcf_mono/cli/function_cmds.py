"""``nvcf-mono function create|list|get|versions|update|delete``: functions and their versions."""

from __future__ import annotations

import argparse
from typing import Any

from nvcf_mono.cli.client import (
    ApiClient,
    add_api_options,
    connect,
    csv_list,
    merged_pairs,
    read_json_object,
    upper,
)
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json, fields, instances_table, table

FUNCTIONS = "/v2/nvcf/functions"
HEALTH_PROTOCOLS = {"http": "HTTP", "grpc": "gRPC"}


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {value}")
    return value


def _protocol(text: str) -> str:
    try:
        return HEALTH_PROTOCOLS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected HTTP or gRPC, got {text!r}") from None


def register(sub: Any) -> None:
    """Add ``function`` and its subcommands."""
    function = sub.add_parser("function", help=help_of("function"))
    cmds = function.add_subparsers(dest="function_command", metavar="SUBCOMMAND")
    function.set_defaults(func=lambda args, ctx: (function.print_help(ctx.stdout), 2)[1])
    _register_create(cmds)
    _register_reads(cmds)
    _register_changes(cmds)


#: The kinds of telemetry a function sends, each to an endpoint of its own (``--<kind>-telemetry-id``).
TELEMETRY_KINDS = ("logs", "metrics", "traces")


def _register_create(cmds: Any) -> None:
    create = cmds.add_parser(
        "create",
        help="register a function (or, with --function-id, a new version of one)",
        description="Register a function from flags, from NVCF's function JSON (--input-file), or both: "
        "flags override the file's fields. Prints the function id and version id.",
    )
    create.add_argument("--function-id", metavar="FID", help="add a version to this function instead")
    create.add_argument("--name", help="function name: letters, digits, '-' and '_' (1-128)")
    artifact = create.add_mutually_exclusive_group()
    artifact.add_argument("--image", metavar="IMAGE", help="container image")
    artifact.add_argument("--helm-chart", metavar="URL", help="Helm chart, oci://<registry>/charts/<name>-X.Y.Z.tgz")
    create.add_argument("--helm-chart-service", metavar="SERVICE", help="the chart's inference service")
    create.add_argument("--inference-url", metavar="PATH", help="inference path, e.g. /echo (/grpc for gRPC)")
    create.add_argument("--inference-port", type=_port, metavar="PORT", help="inference port")
    health = create.add_argument_group("health check (unset fields get NVCF's defaults)")
    health.add_argument("--health-uri", metavar="PATH", help="default /v2/health/ready")
    health.add_argument("--health-port", type=_port, metavar="PORT", help="default: the inference port")
    health.add_argument("--health-protocol", type=_protocol, metavar="HTTP|gRPC", help="default HTTP")
    health.add_argument("--health-timeout", metavar="DURATION", help="ISO-8601, default PT10S")
    health.add_argument("--health-expected-status", type=int, metavar="CODE", help="default 200")
    create.add_argument(
        "--container-args",
        metavar="ARGS",
        help='arguments for the container (write --container-args="--flag ..." when they start with -)',
    )
    create.add_argument(
        "--container-env", action="extend", nargs="+", default=[], metavar="K=V", help="container environment"
    )
    create.add_argument("--secrets", action="extend", nargs="+", default=[], metavar="NAME=VALUE", help="secrets")
    create.add_argument("--function-type", type=upper, choices=("DEFAULT", "STREAMING"), help="default DEFAULT")
    create.add_argument(
        "--api-body-format", type=upper, choices=("CUSTOM", "PREDICT_V2"), help="request body format (CUSTOM)"
    )
    _metadata_options(create)
    telemetry = create.add_argument_group("telemetry endpoints (ids from POST /v2/nvcf/telemetries)")
    for kind in TELEMETRY_KINDS:
        telemetry.add_argument(f"--{kind}-telemetry-id", metavar="ID", help=f"where the function's {kind} go")
    create.add_argument("--input-file", metavar="FILE", help="NVCF's function JSON (the POST body)")
    add_api_options(create)
    create.set_defaults(func=_create)


def _register_reads(cmds: Any) -> None:
    listing = cmds.add_parser("list", help="list every function version you can see")
    listing.add_argument(
        "--visibility", metavar="LIST", help="comma-separated: private, authorized, public (default private,authorized)"
    )
    add_api_options(listing)
    listing.set_defaults(func=_list)

    get = cmds.add_parser("get", help="show a function version, or every version of a function")
    get.add_argument("function_id", metavar="FID")
    get.add_argument("version_id", metavar="VID", nargs="?")
    get.add_argument("--include-secrets", action="store_true", help="show the names of the secrets")
    add_api_options(get)
    get.set_defaults(func=_get)

    versions = cmds.add_parser("versions", help="list the versions of a function")
    versions.add_argument("function_id", metavar="FID")
    add_api_options(versions)
    versions.set_defaults(func=_versions)

    queue = cmds.add_parser("queue", help="requests waiting for a function, and where one of them stands")
    queues = queue.add_subparsers(dest="queue_command", metavar="SUBCOMMAND")
    queue.set_defaults(func=lambda args, ctx: (queue.print_help(ctx.stdout), 2)[1])
    status = queues.add_parser("status", help="how many requests wait for each version, and why")
    status.add_argument("function_id", metavar="FID")
    status.add_argument("version_id", metavar="VID", nargs="?")
    add_api_options(status)
    status.set_defaults(func=_queue_status)
    position = queues.add_parser("position", help="where a queued request stands (1 is next)")
    position.add_argument("request_id", metavar="REQUEST_ID", help="its NVCF-REQID")
    add_api_options(position)
    position.set_defaults(func=_queue_position)


def _register_changes(cmds: Any) -> None:
    update = cmds.add_parser(
        "update",
        help="change a version's tags, description or rate limit",
        description="Versions are immutable apart from their metadata: tags, description and rate limit "
        "(replaced whole).",
    )
    update.add_argument("function_id", metavar="FID")
    update.add_argument("version_id", metavar="VID", nargs="?", help=ONLY_VERSION)
    _metadata_options(update)
    update.add_argument("--input-file", metavar="FILE", help="the PUT body as JSON; flags override its fields")
    add_api_options(update)
    update.set_defaults(func=_update)

    delete = cmds.add_parser(
        "delete",
        help="delete a version (its deployment and secrets go with it)",
        description="Prints nothing with --json.",
    )
    delete.add_argument("function_id", metavar="FID")
    delete.add_argument("version_id", metavar="VID")
    add_api_options(delete)
    delete.set_defaults(func=_delete)


#: The help of a version id that may be left out.
ONLY_VERSION = "the version (optional when the function has one)"


def only_version(client: ApiClient, args: argparse.Namespace) -> str:
    """``args.version_id``, or when it was left out the function's only version (set on ``args``)."""
    if not args.version_id:
        listed = client.get(f"{FUNCTIONS}/{args.function_id}/versions").get("functions") or []
        ids = sorted({str(fn.get("versionId")) for fn in listed})
        if len(ids) != 1:
            raise CliError(
                f"function {args.function_id} has {len(ids)} versions; name one after the function id: {', '.join(ids)}"
            )
        args.version_id = ids[0]
    return str(args.version_id)


def _metadata_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tags", type=csv_list, metavar="A,B", help="comma-separated tags")
    parser.add_argument("--description", help="description (default: the name)")
    parser.add_argument("--rate-limit", metavar="RATE", help="invocation rate limit, e.g. 10-S or 100-S,5000-M")


def _create_body(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any]:
    body = read_json_object("--input-file", args.input_file, ctx) if args.input_file else {}
    for flag, field in (
        ("name", "name"),
        ("inference_url", "inferenceUrl"),
        ("inference_port", "inferencePort"),
        ("helm_chart_service", "helmChartServiceName"),
        ("container_args", "containerArgs"),
        ("function_type", "functionType"),
        ("api_body_format", "apiBodyFormat"),
        ("tags", "tags"),
        ("description", "description"),
    ):
        value = getattr(args, flag)
        if value is not None:
            body[field] = value
    # The artifact named on the command line replaces the file's.
    if args.image is not None:
        body["containerImage"] = args.image
        body.pop("helmChart", None)
        body.pop("helmChartServiceName", None)
    if args.helm_chart is not None:
        body["helmChart"] = args.helm_chart
        body.pop("containerImage", None)
    if args.container_env:
        body["containerEnvironment"] = merged_pairs(
            "--container-env", args.container_env, body.get("containerEnvironment"), "key"
        )
    if args.secrets:
        body["secrets"] = merged_pairs("--secrets", args.secrets, body.get("secrets"), "name")
    if args.rate_limit is not None:
        current = body.get("rateLimit")
        body["rateLimit"] = {**(current if isinstance(current, dict) else {}), "rateLimit": args.rate_limit}
    chosen = {f"{kind}TelemetryId": getattr(args, f"{kind}_telemetry_id") for kind in TELEMETRY_KINDS}
    if any(chosen.values()):
        current = body.get("telemetries")
        body["telemetries"] = {**(current if isinstance(current, dict) else {})} | {
            k: v for k, v in chosen.items() if v
        }
    health_flags = {
        "uri": args.health_uri,
        "port": args.health_port,
        "protocol": args.health_protocol,
        "timeout": args.health_timeout,
        "expectedStatusCode": args.health_expected_status,
    }
    if any(v is not None for v in health_flags.values()):
        current = body.get("health")
        health = {**(current if isinstance(current, dict) else {})}
        health.update({k: v for k, v in health_flags.items() if v is not None})
        # NVCF requires every field once "health" is given; fill the rest the way it defaults them.
        health.setdefault("protocol", "gRPC" if body.get("inferenceUrl") == "/grpc" else "HTTP")
        health.setdefault("uri", body.get("healthUri") or "/v2/health/ready")
        health.setdefault("port", body.get("inferencePort") or 8000)
        health.setdefault("timeout", "PT10S")
        health.setdefault("expectedStatusCode", 200)
        body["health"] = health
    missing = [flag for flag, field in (("--name", "name"), ("--inference-url", "inferenceUrl")) if not body.get(field)]
    if missing:
        raise CliError(f"function create: {' and '.join(missing)} required (as flags or in --input-file)")
    return body


def _create(args: argparse.Namespace, ctx: CliContext) -> int:
    body = _create_body(args, ctx)
    client = connect(args, ctx)
    path = f"{FUNCTIONS}/{args.function_id}/versions" if args.function_id else FUNCTIONS
    doc = client.post(path, body)
    if args.json:
        emit_json(ctx, doc)
        return 0
    fn = doc["function"]
    fields(
        ctx,
        [
            ("function id", fn.get("id")),
            ("version id", fn.get("versionId")),
            ("name", fn.get("name")),
            ("status", fn.get("status")),
        ],
    )
    return 0


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    doc = client.get(FUNCTIONS, query={"visibility": args.visibility} if args.visibility else None)
    if args.json:
        emit_json(ctx, doc)
    else:
        _version_table(ctx, doc.get("functions") or [], empty="no functions")
    return 0


def _version_table(ctx: CliContext, functions: list[dict[str, Any]], *, empty: str) -> None:
    table(
        ctx,
        ("FUNCTION ID", "VERSION ID", "NAME", "STATUS", "TYPE", "CREATED"),
        (
            (
                fn.get("id"),
                fn.get("versionId"),
                fn.get("name"),
                fn.get("status"),
                fn.get("functionType"),
                fn.get("createdAt"),
            )
            for fn in functions
        ),
        empty=empty,
    )


def _get_version(client: ApiClient, fid: str, vid: str, include_secrets: bool) -> Any:
    # Said either way: the API names the secrets unless told not to, the CLI only when asked.
    query = {"includeSecrets": "true" if include_secrets else "false"}
    return client.get(f"{FUNCTIONS}/{fid}/versions/{vid}", query=query)


def _get(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    if args.version_id:
        doc = _get_version(client, args.function_id, args.version_id, args.include_secrets)
        if args.json:
            emit_json(ctx, doc)
        else:
            show_function(ctx, doc["function"])
        return 0
    listed = client.get(f"{FUNCTIONS}/{args.function_id}/versions")
    functions = listed.get("functions") or []
    if args.include_secrets:
        # The versions listing never carries secret names; each version's own read does.
        functions = [
            _get_version(client, fn["id"], fn["versionId"], True)["function"]
            if not fn.get("ownedByDifferentAccount")
            else fn
            for fn in functions
        ]
        listed = {**listed, "functions": functions}
    if args.json:
        emit_json(ctx, listed)
        return 0
    for index, fn in enumerate(functions):
        if index:
            print(file=ctx.stdout)
        show_function(ctx, fn)
    return 0


def _versions(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    doc = client.get(f"{FUNCTIONS}/{args.function_id}/versions")
    if args.json:
        emit_json(ctx, doc)
    else:
        _version_table(ctx, doc.get("functions") or [], empty="no versions")
    return 0


def _queue_status(args: argparse.Namespace, ctx: CliContext) -> int:
    path = f"/v2/nvcf/queues/functions/{args.function_id}"
    doc = connect(args, ctx).get(path + (f"/versions/{args.version_id}" if args.version_id else ""))
    if args.json:
        emit_json(ctx, doc)
        return 0
    table(
        ctx,
        ("VERSION ID", "NAME", "STATUS", "WAITING", "WHY"),
        (
            (
                q.get("functionVersionId"),
                q.get("functionName"),
                q.get("functionStatus"),
                q.get("queueDepth"),
                q.get("waitReason"),
            )
            for q in doc.get("queues") or []
        ),
        empty=f"function {args.function_id} has no versions",
    )
    return 0


def _queue_position(args: argparse.Namespace, ctx: CliContext) -> int:
    doc = connect(args, ctx).get(f"/v2/nvcf/queues/{args.request_id}/position")
    if args.json:
        emit_json(ctx, doc)
    else:
        print(
            f"position {doc['positionInQueue']} (1 is next) for function {doc['functionId']} version "
            f"{doc['functionVersionId']}",
            file=ctx.stdout,
        )
    return 0


def _update(args: argparse.Namespace, ctx: CliContext) -> int:
    body = read_json_object("--input-file", args.input_file, ctx) if args.input_file else {}
    if args.tags is not None:
        body["tags"] = args.tags
    if args.description is not None:
        body["description"] = args.description
    if args.rate_limit is not None:
        current = body.get("rateLimit")
        body["rateLimit"] = {**(current if isinstance(current, dict) else {}), "rateLimit": args.rate_limit}
    if not body:
        raise CliError("function update: give at least one of --tags, --description, --rate-limit or --input-file")
    client = connect(args, ctx)
    doc = client.put(f"{FUNCTIONS}/{args.function_id}/versions/{only_version(client, args)}", body)
    if args.json:
        emit_json(ctx, doc)
    else:
        show_function(ctx, doc["function"])
    return 0


def _delete(args: argparse.Namespace, ctx: CliContext) -> int:
    client = connect(args, ctx)
    client.delete(f"{FUNCTIONS}/{args.function_id}/versions/{args.version_id}")
    if not args.json:
        print(f"deleted version {args.version_id} of function {args.function_id}", file=ctx.stdout)
    return 0


def show_function(ctx: CliContext, fn: dict[str, Any]) -> None:
    """A function version as ``key: value`` lines, then its instances."""
    health = fn.get("health")
    if not isinstance(health, dict) and fn.get("healthUri"):
        # No health object: the check NVCF runs is the healthUri with its defaults.
        health = {
            "protocol": "gRPC" if fn.get("inferenceUrl") == "/grpc" else "HTTP",
            "uri": fn["healthUri"],
            "port": fn.get("inferencePort") or 8000,
            "timeout": "PT10S",
            "expectedStatusCode": 200,
        }
    health_text = None
    if isinstance(health, dict):
        health_text = (
            f"{health.get('protocol')} {health.get('uri')} on port {health.get('port')} "
            f"(timeout {health.get('timeout')}, expects {health.get('expectedStatusCode')})"
        )
    inference = None
    if fn.get("inferenceUrl"):
        port = fn.get("inferencePort")
        inference = fn["inferenceUrl"] + (f" on port {port}" if port else "")
    env = fn.get("containerEnvironment")
    rate = fn.get("rateLimit")
    instances = fn.get("activeInstances")
    fields(
        ctx,
        [
            ("function id", fn.get("id")),
            ("version id", fn.get("versionId")),
            ("name", fn.get("name")),
            ("status", fn.get("status")),
            ("description", fn.get("description")),
            ("account", fn.get("ncaId")),
            ("owner", "another account (shared with you)" if fn.get("ownedByDifferentAccount") else None),
            ("created", fn.get("createdAt")),
            ("image", fn.get("containerImage")),
            ("helm chart", fn.get("helmChart")),
            ("helm service", fn.get("helmChartServiceName")),
            ("inference", inference),
            ("health", health_text),
            ("function type", fn.get("functionType")),
            ("api body format", fn.get("apiBodyFormat")),
            ("container args", fn.get("containerArgs")),
            ("container env", [f"{e.get('key')}={e.get('value')}" for e in env] if env else None),
            ("tags", fn.get("tags") or None),
            ("secrets", fn.get("secrets")),
            ("rate limit", rate.get("rateLimit") or rate if isinstance(rate, dict) else None),
            ("instances", len(instances) if instances is not None else None),
        ],
    )
    instances_table(ctx, instances or [], state="instanceStatus")
