"""Attribute names of the spans every process writes (traces are searched by them across processes)."""

from __future__ import annotations

REQUEST_ID = "nvcf.request_id"
FUNCTION_ID = "nvcf.function_id"
FUNCTION_VERSION_ID = "nvcf.function_version_id"
#: Which delivery of the request this is (1 for the first).
ATTEMPT = "nvcf.attempt"
INSTANCE_ID = "nvcf.instance_id"
NCA_ID = "nvcf.nca_id"
TASK_ID = "nvct.task_id"
#: A request the instance did not answer (it failed there; another instance may get it).
OUTCOME = "nvcf.outcome"

# The instance's metrics, as a function's metrics telemetry receives them.
WORKER_REQUESTS = "nvcf.worker.requests"
WORKER_REQUEST_DURATION = "nvcf.worker.request.duration"
