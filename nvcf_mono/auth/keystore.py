"""API keys on the bus: minted and revoked by the control plane, verified on every node from a mirror.

Verification is a dictionary lookup in a watch-fed copy of the bucket (no I/O per request). A node
records its own writes at once, and other nodes see them through the watch within milliseconds,
so a revoked key stops working at once; expiry is checked against the clock on every request.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import final

import anyio
import attrs
from anyio.abc import TaskStatus

from nvcf_mono.auth.apikeys import KEY_PREFIX, KeyFormatError, generate, masked, parse
from nvcf_mono.auth.principal import AuthError, Principal
from nvcf_mono.auth.secret import Keyring
from nvcf_mono.bus.api import Bus
from nvcf_mono.bus.mirror import KvMirror, Unchanged
from nvcf_mono.contracts import buckets
from nvcf_mono.late import Late
from nvcf_mono.models.api_key import ApiKeyRecord, Authorizations, KeyStatus
from nvcf_mono.models.common import iso, new_id, parse_iso, utc_now
from nvcf_mono.services import ServiceKey


@final
class ApiKeyStore:
    """Create, list, revoke and verify API keys."""

    def __init__(self, *, log: logging.Logger | None = None) -> None:
        self._keyring: Late[Keyring] = Late("API keys")
        self._log = log or logging.getLogger("nvcf_mono.auth.keys")
        self._mirror: Late[KvMirror[ApiKeyRecord]] = Late("API keys")
        # Per-request verification is a dict hit: a key's hash (an HMAC) is computed once, and its
        # principal is reused while the mirror holds the very same record (a change makes a new one).
        self._digests: dict[bytes, str] = {}
        self._principals: dict[str, tuple[ApiKeyRecord, Principal, float]] = {}
        #: Key id -> stored hash, as of the mirror's generation ``_ids_generation``.
        self._ids: dict[str, str] = {}
        self._ids_generation = -1

    def bind(self, keyring: Keyring) -> None:
        """The platform secret's keys (known once the auth plugin runs)."""
        self._keyring.set(keyring)
        self._digests.clear()  # hashes made with other keys
        self._principals.clear()

    @property
    def keyring(self) -> Keyring:
        return self._keyring.get()

    @property
    def mirror(self) -> KvMirror[ApiKeyRecord]:
        return self._mirror.get()

    async def run(self, bus: Bus, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Mirror the bucket until cancelled."""
        mirror = KvMirror(bus.kv(buckets.API_KEYS.name), buckets.API_KEY, log=self._log)
        self._mirror.set(mirror)
        self._ids_generation = -1  # an index of another copy
        await mirror.run(bus, task_status=task_status)

    # ---- verification ------------------------------------------------------------------------------

    def _digest(self, token: str) -> str:
        """The stored hash a key's value names; KeyFormatError for a value this platform never minted."""
        # Remembered by a fast hash of the key, so no key value is kept in memory past its request.
        seen = hashlib.blake2b(token.encode(), digest_size=16).digest()
        digest = self._digests.get(seen)
        if digest is None:
            digest = parse(token, self.keyring.api_key_domain_key)
            if len(self._digests) >= _CACHE_LIMIT:
                self._digests.clear()
            self._digests[seen] = digest  # only well-formed keys of this platform get here
        return digest

    def record_of(self, token: str) -> ApiKeyRecord | None:
        """The stored record of a key's value (any status); None when unknown or revoked.

        Raises KeyFormatError for a value that is not a key of this platform.
        """
        if not token.startswith(KEY_PREFIX):
            raise KeyFormatError(f"an API key starts with {KEY_PREFIX!r}")
        return self.mirror.get(self._digest(token))

    def verify(self, token: str) -> Principal | None:
        """The principal of an ``nvapi-`` key; None for other tokens; AuthError for bad keys."""
        if not token.startswith(KEY_PREFIX):
            return None
        try:
            digest = self._digest(token)
        except KeyFormatError as err:
            raise AuthError(401, f"invalid API key: {err}") from err
        record = self.mirror.get(digest)
        if record is None:
            raise AuthError(401, "the API key is unknown or has been revoked")
        cached = self._principals.get(digest)
        if cached is not None and cached[0] is record and time.time() < cached[2]:
            return cached[1]
        status = effective_status(record)
        if status is not KeyStatus.ACTIVE:
            raise AuthError(401, f"the API key is {status.value.lower()}")
        principal = Principal(
            kind="api_key",
            subject=record.owner_id,
            account=record.nca_id,
            scopes=record.authorizations.scopes(),
            resources=record.authorizations.resources(),
            key_id=record.id,
        )
        if len(self._principals) >= _CACHE_LIMIT:
            self._principals.clear()
        self._principals[digest] = (record, principal, parse_iso(record.expires_at).timestamp())
        return principal

    # ---- management --------------------------------------------------------------------------------

    async def create(
        self,
        *,
        nca_id: str,
        owner_id: str,
        description: str,
        authorizations: Authorizations,
        expires_in: timedelta | None = None,
        expires_at: datetime | None = None,
        issuer_service_id: str,
        audience_service_ids: Sequence[str],
    ) -> tuple[ApiKeyRecord, str]:
        """Mint a key expiring after ``expires_in`` or at ``expires_at``; returns the record and the value."""
        if (expires_in is None) == (expires_at is None):
            raise ValueError("give exactly one of expires_in and expires_at")
        value, digest = generate(self.keyring.api_key_domain_key)
        now = utc_now()
        record = ApiKeyRecord(
            id=new_id(),
            hash=digest,
            nca_id=nca_id,
            owner_id=owner_id,
            description=description,
            created_at=iso(now),
            expires_at=iso(expires_at or now + (expires_in or timedelta())),
            masked=masked(KEY_PREFIX, digest),
            authorizations=authorizations,
            issuer_service_id=issuer_service_id,
            audience_service_ids=tuple(audience_service_ids),
        )
        revision = await self.mirror.kv.create(digest, buckets.API_KEY.encode(record))
        self.mirror.note(digest, record, revision)
        return record, value

    def find(self, key_id: str) -> ApiKeyRecord | None:
        """The record of a key by its id (any status); None when unknown or revoked."""
        mirror = self.mirror
        if self._ids_generation != mirror.generation:
            # Rebuilt when the copy changed: delegation tokens look their key up on every request.
            self._ids = {record.id: digest for digest, record in mirror.items()}
            self._ids_generation = mirror.generation
        digest = self._ids.get(key_id)
        return None if digest is None else mirror.get(digest)

    def list(self, *, nca_id: str | None = None) -> list[ApiKeyRecord]:
        records = [r for r in self.mirror.values() if nca_id is None or r.nca_id == nca_id]
        return sorted(records, key=lambda r: r.created_at)

    async def update_authorizations(self, key_id: str, authorizations: Authorizations) -> ApiKeyRecord | None:
        """Replace a key's authorizations; every node applies them to its next request. None: no such key."""
        record = self.find(key_id)
        if record is None:
            return None

        def change(current: ApiKeyRecord | None) -> ApiKeyRecord:
            if current is None:
                raise Unchanged  # revoked meanwhile
            return attrs.evolve(current, authorizations=authorizations)

        return await self.mirror.mutate(record.hash, change)

    async def remove_expired(self, kept: timedelta) -> int:
        """Remove the records of keys expired more than ``kept`` ago; how many went.

        An expired key is listed as EXPIRED for a while (its owner sees why calls fail), then goes: the
        bucket holds the keys that work or just stopped, not every key ever minted.
        """
        cutoff = utc_now() - kept
        gone = 0
        for record in self.mirror.values():
            # Straight by its digest: revoke() looks the id up, in an index every deletion makes it rebuild.
            if parse_iso(record.expires_at) < cutoff and self.mirror.get(record.hash) is not None:
                await self._delete(record)
                gone += 1
        return gone

    async def revoke(self, key_id: str) -> bool:
        """Delete a key; it stops working on this node at once and on others within the watch delay."""
        record = self.find(key_id)
        if record is None:
            return False
        await self._delete(record)
        return True

    async def _delete(self, record: ApiKeyRecord) -> None:
        revision = await self.mirror.kv.delete(record.hash)
        self.mirror.note(record.hash, None, revision)


def effective_status(record: ApiKeyRecord) -> KeyStatus:
    """A stored ACTIVE key past its expiry reads as EXPIRED."""
    if record.status is KeyStatus.ACTIVE and parse_iso(record.expires_at) <= utc_now():
        return KeyStatus.EXPIRED
    return record.status


#: Verified keys remembered (a full cache starts afresh: it only ever costs a recomputation).
_CACHE_LIMIT = 4096

#: Provided by the ``auth_api_key`` plugin.
API_KEY_STORE: ServiceKey[ApiKeyStore] = ServiceKey("nvcf_mono.auth.api_keys")
