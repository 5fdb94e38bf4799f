"""Tasks (NVCT) as the API sees them: launch with validation, read, page through, cancel, delete, secrets.

A task belongs to one account: another account's task id answers 404, as an unknown one does. An API
key limited to some tasks (``task:<id>`` resources) reaches only those (403 for the account's others).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

import attrs

from nvcf_mono.auth.principal import Principal
from nvcf_mono.bus.errors import BusError
from nvcf_mono.bus.mirror import Unchanged
from nvcf_mono.contracts import buckets
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.cluster import Cluster
from nvcf_mono.models.common import NameValue, duration_seconds, is_uuid, iso_seconds, new_id, now_iso
from nvcf_mono.models.secret import SealedSecrets
from nvcf_mono.models.task import (
    DEFAULT_GRACE,
    DEFAULT_MAX_QUEUED,
    TERMINAL,
    CreateTaskRequest,
    ResultHandlingStrategy,
    Task,
    TaskEvent,
    TaskGpuSpecification,
    TaskResult,
    TaskStatus,
)
from nvcf_mono.planes.control.account_limits import one_more
from nvcf_mono.planes.control.catalog import HELM_CAPABILITY, check_placement
from nvcf_mono.planes.control.charts import check_chart
from nvcf_mono.planes.control.context import Control
from nvcf_mono.planes.control.service import open_secrets, seal_secrets
from nvcf_mono.planes.control.tasks.lifecycle import first_event, transition
from nvcf_mono.planes.control.tasks.scheduler import purge_task, spec_of, stop_instance
from nvcf_mono.planes.control.telemetry import check_chosen
from nvcf_mono.planes.control.validation import check_helm_artifact, check_secrets, check_workload
from nvcf_mono.structure import evolve

T = TypeVar("T")

#: All of a task's secrets together, as JSON: kept well under the bus's message size limit.
MAX_SECRETS_BYTES = 512 * 1024
#: GFN runs tasks for at most 8 hours and needs the limit stated (reference control-plane §2.3).
GFN_BACKEND = "GFN"
GFN_MAX_RUNTIME = 8 * 3600.0
_ITEM_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def bad(detail: str) -> ProblemError:
    return ProblemError(400, detail)


def not_found(task_id: str) -> ProblemError:
    return ProblemError(404, f"Task '{task_id}' not found")


# ---- access -----------------------------------------------------------------------------------------


def key_reaches(principal: Principal, task_id: str | None) -> bool:
    """May the caller's credential reach this task (None: tasks in general)? Tokens reach every task."""
    return principal.resources is None or principal.resources.allows_task(task_id)


async def find_task(ctl: Control, principal: Principal, account: str, task_id: str) -> Task:
    """The account's task: 404 when unknown or another account's, 403 when the key's resources exclude it."""
    if not is_uuid(task_id):
        raise not_found(task_id)
    task = await ctl.store.tasks.fetch(task_id)
    if task is None or task.nca_id != account:
        raise not_found(task_id)
    if not key_reaches(principal, task.id):
        raise ProblemError(403, f"the API key does not grant access to task '{task_id}'")
    return task


# ---- create -----------------------------------------------------------------------------------------


def refuse_artifacts(req: CreateTaskRequest) -> None:
    """Fields of NVCT's schema this platform does not run: a clear 400, never silently ignored."""
    for name, value in (("models", req.models), ("resources", req.resources)):
        if value is not None:
            raise bad(
                f"'{name}' is not supported by this platform: tasks run a container image without model or "
                f"resource artifacts; remove '{name}' from the request"
            )


def check_artifact(req: CreateTaskRequest, *, allow_local_charts: bool = False) -> None:
    """Exactly one of ``containerImage`` and ``helmChart``; a chart URL of NVCF's shape."""
    if req.container_image is None and req.helm_chart is None:
        raise bad("One of the following properties 'containerImage' or 'helmChart' must be specified")
    if req.container_image is not None and req.helm_chart is not None:
        raise bad("Cannot specify both 'containerImage' and 'helmChart'")
    if req.helm_chart is not None:
        check_helm_artifact(req.helm_chart, req.container_args, req.container_environment, allow_local_charts)
    if req.container_image is not None and not req.container_image.strip():
        raise bad("'containerImage' must not be blank")


def positive_seconds(name: str, value: str | None) -> float | None:
    """Seconds of a duration field (already checked to be ISO-8601); a zero duration is refused."""
    if value is None:
        return None
    seconds = duration_seconds(value)
    if seconds <= 0:
        raise bad(f"'{name}' must be longer than zero, got {value!r}")
    return seconds


@attrs.frozen
class Durations:
    """A task's durations as stored: defaults filled in."""

    max_runtime: str | None
    max_queued: str
    grace: str


def check_durations(req: CreateTaskRequest, backend: str | None) -> Durations:
    """Defaults PT72H (queued) and PT1H (grace); the grace period fits in the runtime when one is given.

    Without a grace period, a runtime shorter than the default grace period becomes the grace period,
    so a short task needs no second duration to be accepted.
    """
    runtime = positive_seconds("maxRuntimeDuration", req.max_runtime_duration)
    positive_seconds("maxQueuedDuration", req.max_queued_duration)
    grace = positive_seconds("terminationGracePeriodDuration", req.termination_grace_period_duration)
    if backend is not None and backend.upper() == GFN_BACKEND:
        if runtime is None:
            raise bad("'maxRuntimeDuration' is required for backend GFN")
        if runtime > GFN_MAX_RUNTIME:
            raise bad(f"'maxRuntimeDuration' must be at most PT8H for backend GFN, got {req.max_runtime_duration!r}")
    if grace is not None and runtime is not None and grace > runtime:
        raise bad(
            f"'terminationGracePeriodDuration' ({req.termination_grace_period_duration}) must be less than or "
            f"equal to 'maxRuntimeDuration' ({req.max_runtime_duration})"
        )
    default_grace = DEFAULT_GRACE
    if runtime is not None and runtime < duration_seconds(DEFAULT_GRACE):
        default_grace = iso_seconds(runtime)
    return Durations(
        max_runtime=req.max_runtime_duration,
        max_queued=req.max_queued_duration or DEFAULT_MAX_QUEUED,
        grace=req.termination_grace_period_duration or default_grace,
    )


def check_gpu_specification(
    clusters: Iterable[Cluster], account: str, spec: TaskGpuSpecification, *, helm: bool = False
) -> TaskGpuSpecification:
    """The spec against the registered clusters, with the deployment checks' wording; names as registered."""
    if not helm and spec.configuration is not None:
        raise bad("'configuration' may only be given for a Helm task")
    if not helm and spec.helm_validation_policy is not None:
        raise bad("'helmValidationPolicy' may only be given for a Helm task")
    if spec.configuration is not None and not isinstance(spec.configuration, dict):
        raise bad("'configuration' must be a JSON object of Helm values")
    normalized, sites = check_placement(clusters, account, spec_of(spec))
    if helm and not any(HELM_CAPABILITY in c.capabilities for c, _ in sites):
        raise bad(
            "Helm tasks need a cluster whose agent installs Helm charts (the Kubernetes backend, capability "
            f"'{HELM_CAPABILITY}'); the matching clusters ({', '.join(c.cluster_name for c, _ in sites)}) "
            "run container tasks only"
        )
    return evolve(spec, gpu=normalized.gpu, instance_type=normalized.instance_type)


def check_secret_size(values: dict[str, Any]) -> None:
    if len(json.dumps(values, separators=(",", ":")).encode()) > MAX_SECRETS_BYTES:
        raise bad(
            f"the task's secrets together would exceed {MAX_SECRETS_BYTES // 1024} KiB; use fewer or smaller secrets"
        )


async def check_unfinished(ctl: Control, account: str) -> None:
    """400 when the account already has its ``maxTasksAllowed`` tasks queued, launched or running.

    The account's limit is on tasks at work, not kept ones (``max_account_tasks`` bounds those): a batch of
    tasks may be launched again and again as earlier ones finish, without deleting them.
    """
    record = await ctl.store.accounts.fetch(account)
    if record is None:
        return
    most = record.max_tasks_allowed
    unfinished = sum(1 for t in ctl.store.tasks.values() if t.nca_id == account and t.status not in TERMINAL)
    if unfinished >= most:
        raise ProblemError(
            400,
            f"Reached or exceeded the max limit for the number of tasks allowed: {most} (the account's "
            f"maxTasksAllowed, which an admin may raise; {unfinished} of its tasks are queued or running); launch "
            "more once some have finished or been canceled",
        )


async def create_task(ctl: Control, principal: Principal, account: str, req: CreateTaskRequest) -> Task:
    """Validate and store a new task, QUEUED, with its first event; the scheduler places it."""
    if not key_reaches(principal, None):
        raise ProblemError(403, "the API key may launch tasks only with the resource 'account-tasks:*'")
    refuse_artifacts(req)
    check_artifact(req, allow_local_charts=ctl.config.helm.allow_local_charts)
    check_workload(req.container_environment, req.container_args)
    helm = req.helm_chart is not None
    spec = check_gpu_specification(ctl.store.clusters.values(), account, req.gpu_specification, helm=helm)
    if req.helm_chart is not None and ctl.config.helm.enabled:
        await check_chart(
            ctl.validator,
            chart=req.helm_chart,
            service_name=None,
            service_port=None,
            configuration=spec.configuration,
            account=(ctl.store, ctl.keyring, account),
            what=f"helmChart {req.helm_chart!r}",
        )
    durations = check_durations(req, spec.backend)
    secrets = check_secrets(req.secrets)
    check_secret_size(secrets)
    most = ctl.config.tasks.max_account_tasks
    async with one_more(
        ctl,
        count=lambda: sum(1 for t in ctl.store.tasks.values() if t.nca_id == account),
        most=most or None,
        refusal=f"the account keeps {most} tasks, the most it may (plugins.control.tasks.max_account_tasks; "
        "finished ones count until they are deleted or their retention ends); delete tasks no longer needed",
    ):
        await check_unfinished(ctl, account)
        await check_chosen(ctl.store, account, req.telemetries)
        task_id = new_id()
        if secrets:
            key = buckets.task_secrets_key(task_id)
            await ctl.store.secrets.put(key, seal_secrets(ctl, key, secrets))
        stamp = now_iso()
        task = Task(
            id=task_id,
            nca_id=account,
            name=req.name,
            status=TaskStatus.QUEUED,
            gpu_specification=spec,
            created_at=stamp,
            last_updated_at=stamp,
            result_handling_strategy=req.result_handling_strategy or ResultHandlingStrategy.UPLOAD,
            max_queued_duration=durations.max_queued,
            termination_grace_period_duration=durations.grace,
            max_runtime_duration=durations.max_runtime,
            container_image=req.container_image,
            helm_chart=req.helm_chart,
            container_args=req.container_args,
            container_environment=req.container_environment,
            results_location=req.results_location,
            secrets=tuple(sorted(secrets)) or None,
            tags=req.tags,
            description=req.description,
            telemetries=req.telemetries,
            events=1,
        )
        await ctl.store.tasks.create(task_id, task)
    await first_event(ctl, task)
    ctl.poke()
    return task


# ---- pages ------------------------------------------------------------------------------------------


@attrs.frozen
class Page(Generic[T]):
    """Some items and the cursor of the next page (None on the last)."""

    items: tuple[T, ...]
    cursor: str | None


#: Where an item sorts: (a timestamp or sequence, its id). A cursor is the position of a page's last item.
Position = tuple[str, str]


def encode_cursor(position: Position) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(position)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Position:
    """The position a cursor names; 400 for anything this API did not hand out."""
    invalid = bad(f"invalid cursor {cursor[:64]!r}: pass the cursor of the previous page, or none for the first")
    try:
        position = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise invalid from None
    if not isinstance(position, list) or len(position) != 2 or not all(isinstance(p, str) for p in position):
        raise invalid
    return position[0], position[1]


def paginate(items: Iterable[T], order: Callable[[T], Position], cursor: str | None, limit: int) -> Page[T]:
    """Items in ``order`` after the cursor's position: stable under inserts and deletes between pages."""
    ordered = sorted(items, key=order)
    if cursor:
        after = decode_cursor(cursor)
        ordered = [item for item in ordered if order(item) > after]
    page = tuple(ordered[:limit])
    return Page(items=page, cursor=encode_cursor(order(page[-1])) if len(ordered) > limit else None)


def parse_statuses(values: Sequence[str]) -> frozenset[TaskStatus]:
    """Status names, any case; 400 for an unknown one."""
    out = set()
    for value in values:
        try:
            out.add(TaskStatus(value.upper()))
        except ValueError:
            known = ", ".join(s.value for s in TaskStatus)
            raise bad(f"unknown task status {value!r}: use one of {known}") from None
    return frozenset(out)


def task_order(task: Task) -> Position:
    return (task.created_at, task.id)


def list_tasks(
    ctl: Control,
    principal: Principal,
    account: str,
    *,
    statuses: frozenset[TaskStatus],
    cursor: str | None,
    limit: int,
) -> Page[Task]:
    """The account's tasks the caller may reach, oldest first, optionally of some statuses only."""
    shown = (
        t
        for t in ctl.store.tasks.values()
        if t.nca_id == account and key_reaches(principal, t.id) and (not statuses or t.status in statuses)
    )
    return paginate(shown, task_order, cursor, limit)


async def bulk_tasks(ctl: Control, principal: Principal, account: str, task_ids: Iterable[str]) -> list[Task]:
    """The named tasks the caller may see, in the order asked; others are left out."""
    found = []
    for task_id in dict.fromkeys(task_ids):
        if not is_uuid(task_id):
            continue
        task = await ctl.store.tasks.fetch(task_id)
        if task is not None and task.nca_id == account and key_reaches(principal, task.id):
            found.append(task)
    return found


async def events_of(ctl: Control, task_id: str) -> list[tuple[str, TaskEvent]]:
    """Every event of a task with its key (``<taskId>.<sequence>``, zero-padded: keys sort in event order)."""
    async with ctl.store.task_events.watch(buckets.task_item_pattern(task_id)) as watch:
        return [(entry.key, entry.value) for entry in watch.initial]


async def results_of(ctl: Control, task_id: str) -> list[TaskResult]:
    async with ctl.store.task_results.watch(buckets.task_item_pattern(task_id)) as watch:
        return [entry.value for entry in watch.initial]


async def list_events(ctl: Control, task: Task, cursor: str | None, limit: int) -> Page[TaskEvent]:
    page = paginate(await events_of(ctl, task.id), lambda keyed: (keyed[0], keyed[1].event_id), cursor, limit)
    return Page(items=tuple(event for _, event in page.items), cursor=page.cursor)


def result_order(result: TaskResult) -> Position:
    return (result.created_at, result.result_id)


async def list_results(ctl: Control, task: Task, cursor: str | None, limit: int) -> Page[TaskResult]:
    return paginate(await results_of(ctl, task.id), result_order, cursor, limit)


def result_key(task_id: str, result_id: str) -> str:
    """``<taskId>.<resultId>`` in ``nvcf_task_results``."""
    return f"{task_id}.{result_id}"


async def find_result(ctl: Control, task: Task, result_id: str) -> TaskResult:
    """A result whose content the platform kept; 404 otherwise."""
    if task.result_handling_strategy is ResultHandlingStrategy.NONE:
        raise ProblemError(
            404, f"Task '{task.id}' keeps no result content: its resultHandlingStrategy is NONE (metadata only)"
        )
    stored = await ctl.store.task_results.get(result_key(task.id, result_id)) if _ITEM_ID.match(result_id) else None
    if stored is None:
        raise ProblemError(404, f"Result '{result_id}' of task '{task.id}' not found")
    if stored.value.object_name is None:
        raise ProblemError(404, f"Result '{result_id}' of task '{task.id}' has no stored content")
    return stored.value


# ---- change -----------------------------------------------------------------------------------------


def already_finished(task: Task) -> ProblemError:
    return bad(f"Task '{task.id}' is already {task.status.value}: only a task that has not finished can be canceled")


async def cancel_task(ctl: Control, principal: Principal, account: str, task_id: str) -> Task:
    """CANCELED, and its instance stopped; 400 when the task has already finished."""
    task = await find_task(ctl, principal, account, task_id)
    if task.status in TERMINAL:
        raise already_finished(task)
    updated = await transition(ctl, task.id, TaskStatus.CANCELED)
    if updated is None:
        current = await ctl.store.tasks.kv.get(task.id)  # it changed meanwhile: say how it ended
        if current is None:
            raise not_found(task_id)
        raise already_finished(current.value)
    try:
        await stop_instance(ctl, updated, "the task was canceled")
    except BusError as err:
        # The task is CANCELED either way; the scheduler stops instances of finished tasks on its rounds.
        ctl.log.warning("task %s: stopping its instance failed, the scheduler retries: %s", task.id, err)
    return updated


async def delete_task(ctl: Control, principal: Principal, account: str, task_id: str) -> None:
    """Stop its instance unless that was done already, then remove the task and all it left behind."""
    task = await find_task(ctl, principal, account, task_id)
    if not task.terminating:
        # Once the task is gone, the scheduler never stops its instance: even a finished one's.
        await stop_instance(ctl, task, "the task was deleted")
    await purge_task(ctl, task)
    ctl.poke()


async def update_secrets(
    ctl: Control, principal: Principal, account: str, task_id: str, secrets: Sequence[NameValue]
) -> None:
    """Merge secrets over the task's own (204); only a task created with secrets, while it has not finished."""
    if not secrets:
        raise bad("secrets must name at least one secret")
    given = check_secrets(tuple(secrets))
    task = await find_task(ctl, principal, account, task_id)
    if task.status in TERMINAL:
        raise bad(f"Task '{task.id}' is {task.status.value}: the secrets of a finished task cannot change")
    no_secrets = bad(f"Task '{task.id}' was created without secrets: only a task's existing secrets can be updated")
    if not task.secrets:
        raise no_secrets
    key = buckets.task_secrets_key(task.id)

    def merge(current: SealedSecrets | None) -> SealedSecrets:
        if current is None:
            raise no_secrets
        values = open_secrets(ctl, key, current)
        values.update(given)
        check_secret_size(values)
        return seal_secrets(ctl, key, values)

    sealed = await ctl.store.secrets.mutate(key, merge)
    assert sealed is not None
    names = sealed.names

    def rename(current: Task | None) -> Task | None:
        if current is None or current.secrets == names:
            raise Unchanged
        return evolve(current, secrets=names)

    if await ctl.store.tasks.mutate(task.id, rename) is None:
        # Deleted meanwhile: its secrets must not outlive it.
        await ctl.store.secrets.mutate(key, lambda _: None)
        raise not_found(task_id)
