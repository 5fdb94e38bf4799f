"""``nvcf-mono task create|list|get|cancel|delete|events|results|logs``: GPU tasks that run to completion."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nvcf_mono.cli import instance_cmds
from nvcf_mono.cli.client import (
    ApiClient,
    Credential,
    add_api_options,
    connect,
    csv_list,
    merged_pairs,
    positive_float,
    read_json_object,
    upper,
)
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError
from nvcf_mono.cli.output import emit_json, fields, instances_table, table
from nvcf_mono.cli.progress import Progress

TASKS = "/v1/nvct/tasks"
TERMINAL = frozenset(
    {"COMPLETED", "ERRORED", "CANCELED", "EXCEEDED_MAX_RUNTIME_DURATION", "EXCEEDED_MAX_QUEUED_DURATION"}
)
DEFAULT_WAIT = 3600.0
POLL_INTERVAL = 1.0
PAGE = 100
_TASK_KEY_HINT = (
    "Task commands need the task scopes (launch_task, list_tasks, task_details, cancel_task, delete_task, "
    "list_events, list_results, update_secrets): set NVCF_NVCT_API_KEY to a task key "
    "(`nvcf-mono api-key generate --for task`), or pass --token."
)


def _page_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= PAGE:
        raise argparse.ArgumentTypeError(f"must be between 1 and {PAGE}, got {value}")
    return value


def register(sub: Any) -> None:
    """Add ``task`` and its subcommands."""
    task = sub.add_parser("task", help=help_of("task"))
    cmds = task.add_subparsers(dest="task_command", metavar="SUBCOMMAND")
    task.set_defaults(func=lambda args, ctx: (task.print_help(ctx.stdout), 2)[1])
    _register_create(cmds)

    listing = cmds.add_parser("list", help="list the account's tasks, oldest first")
    listing.add_argument("--status", type=csv_list, metavar="S,T", help="only tasks in these statuses (any case)")
    listing.add_argument("--limit", type=_page_size, default=10, metavar="N", help="tasks per page (default 10)")
    listing.add_argument("--cursor", metavar="CURSOR", help="start at this page (from an earlier list)")
    listing.add_argument("--all", action="store_true", help="follow the pages to the last task")
    add_api_options(listing)
    listing.set_defaults(func=_list)

    get = cmds.add_parser("get", help="show a task")
    get.add_argument("task_id", metavar="ID")
    get.add_argument("--include-secrets", action="store_true", help="show the names of the secrets")
    add_api_options(get)
    get.set_defaults(func=_get)

    cancel = cmds.add_parser("cancel", help="cancel a task that has not finished (its instance is stopped)")
    cancel.add_argument("task_id", metavar="ID")
    add_api_options(cancel)
    cancel.set_defaults(func=_cancel)

    delete = cmds.add_parser(
        "delete",
        help="delete a task with its events, results and secrets",
        description="A running task's instance is stopped first. Prints nothing with --json.",
    )
    delete.add_argument("task_id", metavar="ID")
    add_api_options(delete)
    delete.set_defaults(func=_delete)

    events = cmds.add_parser("events", help="show a task's events (every status change), oldest first")
    events.add_argument("task_id", metavar="ID")
    add_api_options(events)
    events.set_defaults(func=_events)

    results = cmds.add_parser("results", help="list a task's results, and download them")
    results.add_argument("task_id", metavar="ID")
    results.add_argument(
        "--download", metavar="DIR", type=Path, help="save each result's content in DIR (created if missing)"
    )
    add_api_options(results)
    results.set_defaults(func=_results)

    logs = cmds.add_parser("logs", help="print the end of the logs of a task's instance")
    logs.add_argument("task_id", metavar="ID")
    instance_cmds.add_log_options(logs)
    add_api_options(logs)
    logs.set_defaults(func=_logs)


def _register_create(cmds: Any) -> None:
    create = cmds.add_parser(
        "create",
        help="launch a task (and, with --wait, follow it to the end)",
        description="Launch a task from flags, from NVCT's task JSON (--input-file), or both: flags override "
        "the file's fields. Prints the task id; with --wait, follows the task until it finishes (exit 0 when "
        "COMPLETED, 1 otherwise), showing status and progress on stderr.",
    )
    create.add_argument("--name", help="task name: letters, digits, '-' and '_' (1-128)")
    create.add_argument("--image", metavar="IMAGE", help="container image")
    create.add_argument("--gpu", help="GPU model, e.g. H100")
    create.add_argument("--instance-type", metavar="TYPE", help="e.g. ON-PREM.GPU.H100_1x")
    where = create.add_mutually_exclusive_group()
    where.add_argument("--backend", help="cluster group to run on")
    where.add_argument("--clusters", type=csv_list, metavar="A,B", help="clusters to run on")
    create.add_argument(
        "--args", dest="container_args", metavar="ARGS", help='container arguments (write --args="--flag ..")'
    )
    create.add_argument("--env", action="extend", nargs="+", default=[], metavar="K=V", help="container environment")
    create.add_argument("--max-runtime", metavar="DURATION", help="ISO-8601, e.g. PT1H (default: no limit)")
    create.add_argument("--max-queued", metavar="DURATION", help="ISO-8601 (default PT72H)")
    create.add_argument("--grace", metavar="DURATION", help="termination grace period, ISO-8601 (default PT1H)")
    create.add_argument(
        "--result-handling",
        type=upper,
        choices=("UPLOAD", "NONE"),
        help="UPLOAD keeps the results for download (default); NONE keeps their metadata only",
    )
    create.add_argument("--results-location", metavar="LOCATION", help="where results belong, e.g. org/team/model")
    create.add_argument("--secret", action="extend", nargs="+", default=[], metavar="NAME=VALUE", help="secrets")
    create.add_argument("--tags", type=csv_list, metavar="A,B", help="comma-separated tags")
    create.add_argument("--description", help="description")
    create.add_argument("--input-file", metavar="FILE", help="NVCT's task JSON (the POST body)")
    create.add_argument("--wait", action="store_true", help="follow the task until it finishes")
    create.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_WAIT,
        metavar="SECONDS",
        help=f"with --wait: stop waiting after this long, exit 1 (default {DEFAULT_WAIT:g})",
    )
    add_api_options(create, timeout_flag="--http-timeout")
    create.set_defaults(func=_create)


# ---- calls -----------------------------------------------------------------------------------------


def _client(args: argparse.Namespace, ctx: CliContext) -> ApiClient:
    """The client of every API command; a task key in env NVCF_NVCT_API_KEY comes before other credentials
    from the environment or a state directory (a --token or --api-key flag still wins).
    """
    nvct_key = ctx.environ.get("NVCF_NVCT_API_KEY")
    if not nvct_key or args.token or args.api_key:
        return connect(args, ctx)
    client = connect(argparse.Namespace(**{**vars(args), "api_key": nvct_key}), ctx)
    client.api_key = Credential(nvct_key, "API key", "env NVCF_NVCT_API_KEY")
    return client


def _api(client: ApiClient, method: str, path: str, *, body: Any = None, query: dict[str, str] | None = None) -> Any:
    """One task call; a 403 says which scopes task commands need."""
    try:
        return client.call(method, path, body=body, query=query, management=False)
    except CliError as err:
        if str(err).startswith("HTTP 403"):
            raise CliError(f"{err}\n{_TASK_KEY_HINT}", err.code) from None
        raise


def _task_path(task_id: str) -> str:
    return f"{TASKS}/{task_id}"


def _pages(client: ApiClient, path: str, items: str, query: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Each page of a listing, following its cursors from ``query``'s."""
    while True:
        doc: dict[str, Any] = _api(client, "GET", path, query=query)
        yield doc
        cursor = doc.get("cursor")
        if not cursor or not doc.get(items):
            return
        query = {**query, "cursor": cursor}


def _everything(client: ApiClient, path: str, items: str) -> list[dict[str, Any]]:
    return [item for doc in _pages(client, path, items, {"limit": str(PAGE)}) for item in doc.get(items) or []]


# ---- create ----------------------------------------------------------------------------------------


def _gpu_specification(args: argparse.Namespace, current: Any) -> dict[str, Any]:
    spec = dict(current) if isinstance(current, dict) else {}
    for key, value in (("gpu", args.gpu), ("instanceType", args.instance_type)):
        if value is not None:
            spec[key] = value
    # A backend and clusters cannot both be given; the one on the command line wins.
    if args.backend is not None:
        spec["backend"] = args.backend
        spec.pop("clusters", None)
    if args.clusters is not None:
        spec["clusters"] = args.clusters
        spec.pop("backend", None)
    return spec


def _create_body(args: argparse.Namespace, ctx: CliContext) -> dict[str, Any]:
    body = read_json_object("--input-file", args.input_file, ctx) if args.input_file else {}
    for attr, field in (
        ("name", "name"),
        ("container_args", "containerArgs"),
        ("max_runtime", "maxRuntimeDuration"),
        ("max_queued", "maxQueuedDuration"),
        ("grace", "terminationGracePeriodDuration"),
        ("result_handling", "resultHandlingStrategy"),
        ("results_location", "resultsLocation"),
        ("tags", "tags"),
        ("description", "description"),
    ):
        value = getattr(args, attr)
        if value is not None:
            body[field] = value
    if args.image is not None:
        body["containerImage"] = args.image
        body.pop("helmChart", None)
    if args.env:
        body["containerEnvironment"] = merged_pairs("--env", args.env, body.get("containerEnvironment"), "key")
    if args.secret:
        body["secrets"] = merged_pairs("--secret", args.secret, body.get("secrets"), "name")
    body["gpuSpecification"] = spec = _gpu_specification(args, body.get("gpuSpecification"))
    missing = [flag for flag, value in (("--name", body.get("name")), ("--gpu", spec.get("gpu"))) if not value]
    if not spec.get("instanceType"):
        missing.append("--instance-type")
    if not body.get("containerImage") and not body.get("helmChart"):
        missing.append("--image")
    if missing:
        raise CliError(f"task create: {', '.join(missing)} required (as flags or in --input-file)")
    return body


def _create(args: argparse.Namespace, ctx: CliContext) -> int:
    body = _create_body(args, ctx)
    client = _client(args, ctx)
    doc = _api(client, "POST", TASKS, body=body)
    if not args.wait:
        _print_task(ctx, doc, args.json, brief=True)
        return 0
    task_id = doc["task"]["id"]
    print(f"task {task_id} launched", file=ctx.stderr, flush=True)
    final = _wait(client, ctx, task_id, args.timeout)
    task = final["task"]
    if task.get("status") == "COMPLETED":
        _print_task(ctx, final, args.json, brief=True)
        return 0
    if args.json:
        emit_json(ctx, final)
    error = (task.get("healthInfo") or {}).get("error")
    raise CliError(f"task {task_id} ended {task.get('status')}" + (f": {error}" if error else ""), 1)


def _progress_line(task: dict[str, Any]) -> str:
    line = str(task.get("status"))
    if task.get("percentComplete"):
        line += f" {task['percentComplete']}%"
    return line


def _wait(client: ApiClient, ctx: CliContext, task_id: str, timeout: float) -> dict[str, Any]:
    """Poll the task until it finishes, printing each change of status or progress; the last answer."""
    started = time.monotonic()
    progress = Progress(ctx.stderr, started)
    try:
        while True:
            doc: dict[str, Any] = _api(client, "GET", _task_path(task_id))
            task = doc["task"]
            line = _progress_line(task)
            progress.show(line)
            if task.get("status") in TERMINAL:
                return doc
            remaining = started + timeout - time.monotonic()
            if remaining <= 0:
                raise CliError(
                    f"timed out after {timeout:g}s waiting for task {task_id} to finish; last seen: {line}\n"
                    f"The task goes on: follow it with `nvcf-mono task get {task_id}`, or stop it with "
                    f"`nvcf-mono task cancel {task_id}`.",
                    1,
                )
            time.sleep(min(POLL_INTERVAL, remaining))
    except KeyboardInterrupt:
        progress.close()
        print("stopped waiting; the task goes on", file=ctx.stderr)
        raise
    finally:
        progress.close()


# ---- read ------------------------------------------------------------------------------------------


def _task_table(ctx: CliContext, tasks: list[dict[str, Any]]) -> None:
    table(
        ctx,
        ("TASK ID", "NAME", "STATUS", "PROGRESS", "INSTANCE TYPE", "CREATED"),
        (
            (
                t.get("id"),
                t.get("name"),
                t.get("status"),
                f"{t.get('percentComplete', 0)}%",
                (t.get("gpuSpecification") or {}).get("instanceType"),
                t.get("createdAt"),
            )
            for t in tasks
        ),
        empty="no tasks",
    )


def _list(args: argparse.Namespace, ctx: CliContext) -> int:
    client = _client(args, ctx)
    query = {"limit": str(args.limit)}
    if args.status:
        query["status"] = ",".join(args.status)
    if args.cursor:
        query["cursor"] = args.cursor
    pages = _pages(client, TASKS, "tasks", query)
    if args.all:
        tasks = [t for doc in pages for t in doc.get("tasks") or []]
        if args.json:
            emit_json(ctx, {"tasks": tasks})
        else:
            _task_table(ctx, tasks)
        return 0
    doc = next(pages)
    if args.json:
        emit_json(ctx, doc)
        return 0
    _task_table(ctx, doc.get("tasks") or [])
    if doc.get("cursor"):
        print(f"more tasks: add --cursor {doc['cursor']} for the next page, or --all", file=ctx.stderr)
    return 0


def show_task(ctx: CliContext, task: dict[str, Any]) -> None:
    """A task as ``key: value`` lines, then its instance."""
    spec = task.get("gpuSpecification") or {}
    env = task.get("containerEnvironment")
    where = spec.get("backend") or ", ".join(spec.get("clusters") or []) or None
    fields(
        ctx,
        [
            ("task id", task.get("id")),
            ("name", task.get("name")),
            ("status", task.get("status")),
            ("progress", f"{task.get('percentComplete', 0)}%"),
            ("error", (task.get("healthInfo") or {}).get("error")),
            ("account", task.get("ncaId")),
            ("created", task.get("createdAt")),
            ("updated", task.get("lastUpdatedAt")),
            ("last heartbeat", task.get("lastHeartbeatAt")),
            ("image", task.get("containerImage")),
            ("helm chart", task.get("helmChart")),
            ("container args", task.get("containerArgs")),
            ("container env", [f"{e.get('key')}={e.get('value')}" for e in env] if env else None),
            ("gpu", f"{spec.get('gpu')} {spec.get('instanceType')}"),
            ("runs on", where),
            ("max runtime", task.get("maxRuntimeDuration")),
            ("max queued", task.get("maxQueuedDuration")),
            ("grace period", task.get("terminationGracePeriodDuration")),
            ("result handling", task.get("resultHandlingStrategy")),
            ("results location", task.get("resultsLocation")),
            ("description", task.get("description")),
            ("tags", task.get("tags") or None),
            ("secrets", task.get("secrets")),
        ],
    )
    instances_table(ctx, task.get("instances") or [], state="instanceState")


def _print_task(ctx: CliContext, doc: Any, as_json: bool, *, brief: bool = False) -> None:
    if as_json:
        emit_json(ctx, doc)
        return
    task = doc["task"]
    if brief:
        fields(ctx, [("task id", task.get("id")), ("name", task.get("name")), ("status", task.get("status"))])
    else:
        show_task(ctx, task)


def _get(args: argparse.Namespace, ctx: CliContext) -> int:
    client = _client(args, ctx)
    query = {"includeSecrets": "true"} if args.include_secrets else None
    _print_task(ctx, _api(client, "GET", _task_path(args.task_id), query=query), args.json)
    return 0


def _cancel(args: argparse.Namespace, ctx: CliContext) -> int:
    client = _client(args, ctx)
    doc = _api(client, "POST", f"{_task_path(args.task_id)}/cancel")
    if args.json:
        emit_json(ctx, doc)
    else:
        print(f"canceled task {args.task_id}; status {doc['task'].get('status')}", file=ctx.stdout)
    return 0


def _delete(args: argparse.Namespace, ctx: CliContext) -> int:
    client = _client(args, ctx)
    _api(client, "DELETE", _task_path(args.task_id))
    if not args.json:
        print(f"deleted task {args.task_id}", file=ctx.stdout)
    return 0


def _events(args: argparse.Namespace, ctx: CliContext) -> int:
    client = _client(args, ctx)
    events = _everything(client, f"{_task_path(args.task_id)}/events", "events")
    if args.json:
        emit_json(ctx, {"events": events})
    else:
        table(ctx, ("CREATED", "MESSAGE"), ((e.get("createdAt"), e.get("message")) for e in events), empty="no events")
    return 0


# ---- results ---------------------------------------------------------------------------------------


def _results(args: argparse.Namespace, ctx: CliContext) -> int:
    client = _client(args, ctx)
    path = f"{_task_path(args.task_id)}/results"
    results = _everything(client, path, "results")
    if args.json:
        emit_json(ctx, {"results": results})
    else:
        table(
            ctx,
            ("RESULT ID", "NAME", "SIZE", "CREATED", "METADATA"),
            ((r.get("resultId"), r.get("name"), r.get("size"), r.get("createdAt"), r.get("metadata")) for r in results),
            empty="no results",
        )
    if args.download is not None:
        _download_all(client, ctx, path, results, args.download)
    return 0


def _download_all(client: ApiClient, ctx: CliContext, path: str, results: list[dict[str, Any]], into: Path) -> None:
    try:
        into.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CliError(f"--download {into}: {err.strerror or err}", 1) from None
    taken: set[str] = set()
    for result in results:
        if result.get("size") is None:
            print(f"result {result.get('name')} ({result.get('resultId')}) has no stored content", file=ctx.stderr)
            continue
        dest = into / _file_name(result, taken)
        size = client.download(f"{path}/{result['resultId']}/content", dest)
        print(f"saved {dest} ({size} bytes)", file=ctx.stderr)


def _file_name(result: dict[str, Any], taken: set[str]) -> str:
    """The result's own name without directories; its id makes a name unique or stands in for none."""
    base = str(result.get("name") or "").replace("\\", "/").rsplit("/", 1)[-1]
    if base in ("", ".", ".."):
        base = str(result["resultId"])
    if base in taken:
        base = f"{result['resultId']}-{base}"
    taken.add(base)
    return base


# ---- logs ------------------------------------------------------------------------------------------


def _logs(args: argparse.Namespace, ctx: CliContext) -> int:
    if args.json and args.follow:
        raise CliError("--json and --follow do not go together: --json prints one answer")
    client = _client(args, ctx)
    task = _api(client, "GET", _task_path(args.task_id))["task"]
    instances = task.get("instances") or []
    instance_id = instances[0].get("instanceId") if instances else None
    if not instance_id:
        raise CliError(f"task {args.task_id} has no instance yet (status {task.get('status')})", 1)
    # The same call and output as `nvcf-mono instance logs`.
    return instance_cmds.show_logs(argparse.Namespace(**{**vars(args), "instance_id": instance_id}), ctx)
