"""The tenancy and operations aggregates of `SessionStore`: workers, API keys (the store sees only hashes: see
`sessions.keys`), tenants' limits, idempotency keys (`sessions.idempotency`) and gateway instance leases
(`sessions.instances`). `SqlSessionStore` implements them in `sessions.store.tenancy`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from sessiongate.sessions.records import (
    ApiKeyRecord,
    IdempotencyHolder,
    IdempotencyRecord,
    InstanceLease,
    TenantRecord,
    WorkerRecord,
)

__all__ = ["ApiKeysStore", "IdempotencyStore", "InstancesStore", "TenantsStore", "WorkersStore"]


class WorkersStore(Protocol):
    """The workers the gateway knows, with their state."""

    async def upsert_worker(
        self,
        worker_id: str,
        *,
        url: str,
        state: str,
        last_seen_at: datetime,
        info: Mapping[str, Any] | None = None,
    ) -> WorkerRecord:
        """Insert or update a worker; `info=None` keeps the stored info."""
        ...

    async def list_workers(self, *, state: str | None = None) -> list[WorkerRecord]: ...


class ApiKeysStore(Protocol):
    """API keys, by the hash of their secret."""

    async def create_api_key(
        self, *, tenant_id: str, name: str, prefix: str, secret_hash: str, created_at: datetime
    ) -> ApiKeyRecord:
        """A new live key (`key_` + 24 hex); creates the tenant on first use."""
        ...

    async def find_api_key(self, secret_hash: str) -> ApiKeyRecord | None:
        """The live key with this hash, or None (unknown or revoked)."""
        ...

    async def list_api_keys(self, *, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        """All keys (revoked ones included), oldest first; of one tenant when `tenant_id` is given."""
        ...

    async def revoke_api_key(self, key_id: str, *, revoked_at: datetime) -> ApiKeyRecord:
        """Revoke a key (idempotent); `ApiKeyNotFound` if there is no such key."""
        ...


class TenantsStore(Protocol):
    """Tenants, created on first use, with their limit overrides."""

    async def set_tenant_limits(
        self, tenant_id: str, *, max_concurrent: int | None, tokens_per_minute: int | None
    ) -> TenantRecord:
        """Replace the tenant's limit overrides (None: the gateway's global value; 0: no limit); creates the tenant
        on first use."""
        ...

    async def list_tenants(self, *, tenant_id: str | None = None, with_overrides: bool = False) -> list[TenantRecord]:
        """Tenants with their limit overrides, by id; only `tenant_id` when given (empty if it does not exist),
        only those with an override when `with_overrides`."""
        ...


class IdempotencyStore(Protocol):
    """Idempotency keys: claimed by a request, completed with its response, or released; each claim held by the
    gateway process serving it (`sessions.idempotency`)."""

    async def claim_idempotency_key(
        self,
        *,
        tenant_id: str,
        key: str,
        request_hash: str,
        holder: IdempotencyHolder,
        now: datetime,
        stale_before: datetime,
        holder_stale_before: datetime,
    ) -> IdempotencyRecord | None:
        """None if `holder` now holds the key; else the existing claim (pending, or done with a response). A pending
        claim of the same request is taken over when its holder is dead (its instance lease gone, held by another
        run, or renewed before `holder_stale_before`) or when it was claimed before `stale_before`."""
        ...

    async def complete_idempotency_key(
        self, *, tenant_id: str, key: str, holder: IdempotencyHolder, turn_id: str, response: Mapping[str, Any]
    ) -> bool:
        """Record the response to replay; False, writing nothing, when `holder` lost the key to a takeover."""
        ...

    async def release_idempotency_key(self, *, tenant_id: str, key: str, holder: IdempotencyHolder) -> None:
        """Forget a pending claim `holder` still holds (its request failed), so a retry runs anew."""
        ...

    async def delete_idempotency_keys(self, *, created_before: datetime) -> int:
        """Delete the keys claimed before `created_before` (past the retention); how many were deleted."""
        ...


class InstancesStore(Protocol):
    """Gateway instance leases: one run at a time holds an instance id."""

    async def claim_instance(
        self,
        instance_id: str,
        *,
        run: str,
        host: str,
        pid: int,
        stale_before: datetime,
        holder_dead: Callable[[InstanceLease], bool],
    ) -> InstanceLease | None:
        """None when `run` now holds the instance id; else the holder that is still alive (heartbeat at or after
        `stale_before`, and not declared dead by `holder_dead`)."""
        ...

    async def heartbeat_instance(self, instance_id: str, *, run: str) -> bool:
        """Renew the lease; False if `run` lost it to another run."""
        ...

    async def release_instance(self, instance_id: str, *, run: str) -> None: ...
