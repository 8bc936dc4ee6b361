"""Tenant API keys (how a key is made, what the store keeps of it, each replica's memory of lookups) and
tenant cache salts.

A key is `sg-` + 43 URL-safe characters (256 random bits), shown once when it is created. The store keeps only
its sha256 (enough for a secret of that entropy: no salt or slow hash is needed) and its first characters as a
`prefix` to tell keys apart. `KeyRing` turns a presented key into its tenant with one indexed lookup, remembered
for `key_cache_ttl_s` (answers "no such key" included, so guessing keys costs the database nothing); the memory
is bounded, and a revocation through this replica takes effect here at once, on other replicas within the TTL.

`CacheSalts` gives each tenant the `cache_salt` sent with its requests to SGLang, which puts it in every radix
cache key: one tenant's cached KV never serves another's prompt (no timing side channel on shared prefixes).
The salt is an HMAC of the tenant id under the gateway's secret, so it cannot be guessed from the tenant id, and
is the same on every replica that shares the secret (their caches, and the shared KV pool, stay reusable).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sessiongate import sessions

__all__ = ["KEY_PREFIX", "CacheSalts", "KeyRing", "NewKey", "create_key", "hash_key", "revoke_key"]

KEY_PREFIX = "sg-"
PREFIX_LENGTH = 10  # "sg-" and 7 characters of the secret: 42 bits, plenty to tell a tenant's keys apart
_MAX_REMEMBERED = 10_000


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key just created: the secret, which nothing stores, and its record."""

    secret: str
    record: sessions.ApiKeyRecord


async def create_key(store: sessions.SessionStore, *, tenant_id: str, name: str = "") -> NewKey:
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    record = await store.create_api_key(
        tenant_id=tenant_id,
        name=name,
        prefix=secret[:PREFIX_LENGTH],
        secret_hash=hash_key(secret),
        created_at=datetime.now(UTC),
    )
    return NewKey(secret=secret, record=record)


async def revoke_key(store: sessions.SessionStore, key_id: str, ring: KeyRing | None = None) -> sessions.ApiKeyRecord:
    record = await store.revoke_api_key(key_id, revoked_at=datetime.now(UTC))
    if ring is not None:
        ring.forget(record.secret_hash)
    return record


class KeyRing:
    """Key -> tenant, through the store, with a bounded per-replica memory of recent answers."""

    def __init__(
        self, store: sessions.SessionStore, *, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._clock = clock
        self._known: OrderedDict[str, tuple[str | None, float]] = OrderedDict()

    async def tenant_for(self, secret: str) -> str | None:
        """The tenant of a live key, or None; `sessions.StoreUnavailable` if the store cannot say."""
        digest = hash_key(secret)
        now = self._clock()
        known = self._known.get(digest)
        if known is not None and known[1] > now:
            return known[0]
        record = await self._store.find_api_key(digest)
        tenant = record.tenant_id if record is not None else None
        self._known[digest] = (tenant, now + self._ttl_s)
        self._known.move_to_end(digest)
        while len(self._known) > _MAX_REMEMBERED:
            self._known.popitem(last=False)
        return tenant

    def forget(self, secret_hash: str) -> None:
        self._known.pop(secret_hash, None)


class CacheSalts:
    """Tenant id -> the tenant's cache salt (HMAC-SHA256 under `secret`, 32 hex digits)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._salts: dict[str, str] = {}

    def for_tenant(self, tenant_id: str) -> str:
        salt = self._salts.get(tenant_id)
        if salt is None:
            digest = hmac.new(self._secret, tenant_id.encode(), hashlib.sha256).hexdigest()
            salt = self._salts[tenant_id] = "tenant-" + digest[:32]
        return salt
