"""``Idempotency-Key``: a retry with the same key (per account and function) names the same request.

The first request with a key records its request id in ``nvcf_idempotency`` with ``create()``, so
of two concurrent retries exactly one enqueues; the other answers for the winner's request as a
status poll would (its result, or 202 with its ``NVCF-REQID``). Before claiming the key the request
is recorded in ``nvcf_requests``, so whoever finds the key also finds the request; the node that
serves it keeps its response as a result for the retries (bounded), also when it answered at once.
A request that fails before it runs (bad input, a full queue, a client that hung up) releases the
key; a retry that found the key just before that claims it again. Requests without the header pay
nothing.

The key also records a fingerprint of the request's body (its first MiB and whether more followed):
the same key with another body is a 422, as the IETF's Idempotency-Key draft asks, rather than the
first request's answer to a request that was never run.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import final

import anyio
import attrs

from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.codec import TypedKV
from nvcf_mono.bus.errors import BusError, ConflictError, NotFound
from nvcf_mono.contracts import buckets
from nvcf_mono.contracts.buckets import IdempotentRequest, RequestRecord, StoredResult
from nvcf_mono.http.problem import ProblemError
from nvcf_mono.models.common import new_id, now_iso
from nvcf_mono.models.function import FunctionVersion
from nvcf_mono.planes.invocation.results import QUEUED, ResultStore

IDEMPOTENCY_KEY = "Idempotency-Key"
MAX_KEY_LENGTH = 255
CLAIM_ATTEMPTS = 3
#: How much of a body its fingerprint covers: retries are read this far before the key is looked up.
FINGERPRINTED = 1024 * 1024


def fingerprint(body: bytes) -> str:
    """A body's fingerprint: the digest of its first ``FINGERPRINTED`` bytes and whether more follow.

    ``body`` is the whole body or at least its first ``FINGERPRINTED + 1`` bytes.
    """
    more = len(body) > FINGERPRINTED
    return hashlib.sha256(memoryview(body)[:FINGERPRINTED]).hexdigest() + ("+" if more else "")


def key_digest(raw: str) -> str:
    """The sha256 hex of a valid key; 400 for an empty, overlong or unprintable one."""
    if not 1 <= len(raw) <= MAX_KEY_LENGTH or not raw.isprintable():
        raise ProblemError(
            400, f"{IDEMPOTENCY_KEY} must be 1 to {MAX_KEY_LENGTH} printable characters, got {len(raw)} characters"
        )
    return hashlib.sha256(raw.encode()).hexdigest()


@final
@attrs.frozen(kw_only=True)
class Claim:
    """The request a key names; ``revision`` is set when this call created the record and runs it."""

    key: str
    request_id: str
    revision: int | None = None
    #: The body fingerprint the key's first request recorded ("" when none was).
    fingerprint: str = ""

    @property
    def owner(self) -> bool:
        return self.revision is not None


@final
class Idempotency:
    """Keys in ``nvcf_idempotency`` (with a TTL) and the results kept for retries."""

    def __init__(
        self, bus: Bus, results: ResultStore, *, ttl: float, record_ttl: float, region: str, log: logging.Logger
    ) -> None:
        self._kv = TypedKV(bus.kv(buckets.IDEMPOTENCY.name), buckets.IDEMPOTENT)
        self._results = results
        self._ttl = ttl
        self._record_ttl = record_ttl
        self._region = region
        self._log = log

    async def claim(self, nca_id: str, fv: FunctionVersion, raw_key: str, body_fingerprint: str) -> Claim:
        """Our new request id when the key is new, else the one the key already names."""
        key = buckets.idempotency_key(nca_id, fv.id, key_digest(raw_key))
        for _ in range(CLAIM_ATTEMPTS):
            found = await self._kv.get(key)
            if found is not None:
                return Claim(key=key, request_id=found.value.request_id, fingerprint=found.value.body_fingerprint)
            request_id = new_id()
            created = now_iso()
            # The request is on record before the key names it: a retry that finds one finds both.
            await self._results.track(
                RequestRecord(
                    request_id=request_id,
                    function_id=fv.id,
                    function_version_id=fv.version_id,
                    nca_id=nca_id,  # the caller's account, like the request itself
                    region=self._region,
                    state=QUEUED,
                    created_at=created,
                ),
                ttl=self._record_ttl,
            )
            try:
                revision = await self._kv.create(
                    key,
                    IdempotentRequest(
                        request_id=request_id,
                        function_version_id=fv.version_id,
                        created_at=created,
                        body_fingerprint=body_fingerprint,
                    ),
                    ttl=self._ttl,
                )
            except ConflictError:
                await self._forget(request_id)  # a concurrent retry won: answer for its request
                continue
            return Claim(key=key, request_id=request_id, revision=revision, fingerprint=body_fingerprint)
        raise ProblemError(409, f"concurrent requests with this {IDEMPOTENCY_KEY} keep failing; retry")

    async def names(self, claim: Claim) -> bool:
        """Whether the key still names the claim's request (False once its owner released it)."""
        found = await self._kv.get(claim.key)
        return found is not None and found.value.request_id == claim.request_id

    async def release(self, claim: Claim) -> None:
        """The request will not run: free the key for a retry (best effort, bounded, shielded)."""
        if claim.revision is None:
            return
        with anyio.move_on_after(5, shield=True):
            try:
                await self._kv.delete(claim.key, revision=claim.revision)
            except (ConflictError, NotFound):
                pass
            except BusError as err:
                self._log.warning("could not release an idempotency key for %s: %s", claim.request_id, err)
            await self._forget(claim.request_id)

    async def _forget(self, request_id: str) -> None:
        try:
            await self._results.records.delete(request_id)
        except BusError as err:
            self._log.debug("could not forget request %s: %s", request_id, err)

    async def stored(self, request_id: str) -> tuple[StoredResult, bytes | AsyncIterator[bytes]] | None:
        """The request's kept result, left in place for the next retry or poll (None while there is none)."""
        found = await self._results.results.get(request_id)
        if found is None:
            return None
        result = found.value
        if result.body_object is None:
            return result, base64.b64decode(result.body)
        return result, self._read(result.body_object)

    async def _read(self, name: str) -> AsyncIterator[bytes]:
        async with self._results.payloads.open(name) as reader:
            async for chunk in reader:
                yield chunk
