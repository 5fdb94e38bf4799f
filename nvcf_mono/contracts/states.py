"""Instance status vocabulary agents report (reference compute-plane §4), shared by agent and control plane."""

from __future__ import annotations

# status
PENDING_FULFILLMENT = "pending-fulfillment"
FULFILLED = "fulfilled"
TERMINATED_NO_CAPACITY = "instance-terminated-no-capacity"
TERMINATED_BY_USER = "instance-terminated-by-user"
TERMINATED_BY_SERVICE = "instance-terminated-by-service"

# instanceState
STARTING = "starting"
RUNNING = "running"
SHUTTING_DOWN = "shutting-down"
TERMINATED = "terminated"
FAILED = "failed"
SUCCEEDED = "succeeded"
NOT_FOUND = "instance-not-found"

# Terminal ("bad") states: the instance is gone and the control plane replaces it.
IMAGE_PULL_ISSUES = "image-pull-issues"
CREATE_CONTAINER_ERROR = "create-container-error"
CONTAINER_RESTART_LOOP = "container-restart-loop"
INIT_CONTAINER_RESTART_LOOP = "init-container-restart-loop"
INIT_CONTAINER_STUCK = "init-container-stuck"
DEGRADED_WORKER = "degraded-worker"
NO_CAPACITY = "instance-terminated-no-capacity"
ADMISSION_ERROR = "instance-terminated-admission-error"
PRECONDITION_FAILURE = "instance-terminated-precondition-failure"
SYNC_ACTION = "instance-terminated-sync-action"
SERVICE_MAINTENANCE = "instance-terminated-service-maintenance"

BAD_STATES = frozenset(
    {
        FAILED,
        NO_CAPACITY,
        ADMISSION_ERROR,
        INIT_CONTAINER_STUCK,
        CONTAINER_RESTART_LOOP,
        INIT_CONTAINER_RESTART_LOOP,
        IMAGE_PULL_ISSUES,
        CREATE_CONTAINER_ERROR,
        DEGRADED_WORKER,
        NOT_FOUND,
    }
)
#: Failures no retry fixes: the image cannot be pulled or its command cannot run.
PERMANENT_CAUSES = frozenset({IMAGE_PULL_ISSUES, CREATE_CONTAINER_ERROR, ADMISSION_ERROR})
#: How a task's instance ended (``terminationCause``): its process ended by itself, or at its deadline.
TASK_COMPLETED = "task-completed"
TASK_FAILED = "task-failed"
EXCEEDED_MAX_RUNTIME = "exceeded-max-runtime"
#: States after which the instance no longer exists.
GONE_STATES = BAD_STATES | {TERMINATED, SUCCEEDED}
