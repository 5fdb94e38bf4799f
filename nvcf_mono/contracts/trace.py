"""Attribute names of the spans every process writes (traces are searched by them across processes)."""

from __future__ import annotations

REQUEST_ID = "nvcf.request_id"
FUNCTION_ID = "nvcf.function_id"
FUNCTION_VERSION_ID = "nvcf.function_version_id"
#: Which delivery of the request this is (1 for the first).
ATTEMPT = "nvcf.attempt"
INSTANCE_ID = "nvcf.instance_id"
