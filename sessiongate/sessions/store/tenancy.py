"""The tenancy and operations aggregates on SQL: workers, API keys, tenants, idempotency keys and gateway instance
leases, each call in a transaction of `StoreTransactions`, delegating to `keys`, `idempotency` and `instances`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select

from sessiongate.sessions import _convert as cv
from sessiongate.sessions import idempotency, instances, keys
from sessiongate.sessions._sql import insert_on_conflict
from sessiongate.sessions.models import Worker
from sessiongate.sessions.protocol.tenancy import (
    ApiKeysStore,
    IdempotencyStore,
    InstancesStore,
    TenantsStore,
    WorkersStore,
)
from sessiongate.sessions.records import (
    ApiKeyRecord,
    IdempotencyHolder,
    IdempotencyRecord,
    InstanceLease,
    TenantRecord,
    WorkerRecord,
)

from .transactions import StoreTransactions

__all__ = ["SqlApiKeys", "SqlIdempotency", "SqlInstances", "SqlTenants", "SqlWorkers"]


class SqlWorkers(StoreTransactions):
    """`WorkersStore` on SQL."""

    async def upsert_worker(
        self,
        worker_id: str,
        *,
        url: str,
        state: str,
        last_seen_at: datetime,
        info: Mapping[str, Any] | None = None,
    ) -> WorkerRecord:
        values = {
            "id": worker_id,
            "url": url,
            "state": cv.one_of(state, cv.WORKER_STATES, "state"),
            "last_seen_at": cv.aware(last_seen_at, "last_seen_at"),
            "info": dict(info) if info is not None else {},
        }
        update_keys = ["url", "state", "last_seen_at"] + (["info"] if info is not None else [])
        upsert = insert_on_conflict(self._backend, Worker, values, update_keys=update_keys)
        async with self._transaction() as db:
            row = await db.scalar(upsert.returning(Worker).execution_options(populate_existing=True))
            assert row is not None  # an upsert always returns its row
            return cv.worker_record(row)

    async def list_workers(self, *, state: str | None = None) -> list[WorkerRecord]:
        stmt = select(Worker).order_by(Worker.id)
        if state is not None:
            stmt = stmt.where(Worker.state == state)
        async with self._transaction(write=False) as db:
            return [cv.worker_record(row) for row in await db.scalars(stmt)]


class SqlApiKeys(StoreTransactions):
    """`ApiKeysStore` on SQL."""

    async def create_api_key(
        self, *, tenant_id: str, name: str, prefix: str, secret_hash: str, created_at: datetime
    ) -> ApiKeyRecord:
        async with self._transaction() as db:
            return await keys.create_api_key(
                db,
                self._backend,
                key_id=cv.new_id("key_"),
                tenant_id=tenant_id,
                name=name,
                prefix=prefix,
                secret_hash=secret_hash,
                created_at=cv.aware(created_at, "created_at"),
            )

    async def find_api_key(self, secret_hash: str) -> ApiKeyRecord | None:
        async with self._transaction(write=False) as db:
            return await keys.find_api_key(db, secret_hash)

    async def list_api_keys(self, *, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        async with self._transaction(write=False) as db:
            return list(await keys.list_api_keys(db, tenant_id=tenant_id))

    async def revoke_api_key(self, key_id: str, *, revoked_at: datetime) -> ApiKeyRecord:
        async with self._transaction() as db:
            return await keys.revoke_api_key(db, key_id, revoked_at=cv.aware(revoked_at, "revoked_at"))


class SqlTenants(StoreTransactions):
    """`TenantsStore` on SQL."""

    async def set_tenant_limits(
        self, tenant_id: str, *, max_concurrent: int | None, tokens_per_minute: int | None
    ) -> TenantRecord:
        async with self._transaction() as db:
            return await keys.set_tenant_limits(
                db,
                self._backend,
                tenant_id,
                max_concurrent=max_concurrent,
                tokens_per_minute=tokens_per_minute,
                now=self._clock(),
            )

    async def list_tenants(self, *, tenant_id: str | None = None, with_overrides: bool = False) -> list[TenantRecord]:
        async with self._transaction(write=False) as db:
            return await keys.list_tenants(db, tenant_id=tenant_id, with_overrides=with_overrides)


class SqlIdempotency(StoreTransactions):
    """`IdempotencyStore` on SQL."""

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
        async with self._transaction() as db:
            return await idempotency.claim(
                db,
                self._backend,
                tenant_id=tenant_id,
                key=key,
                request_hash=request_hash,
                holder=holder,
                now=cv.aware(now, "now"),
                stale_before=cv.aware(stale_before, "stale_before"),
                holder_stale_before=cv.aware(holder_stale_before, "holder_stale_before"),
            )

    async def complete_idempotency_key(
        self, *, tenant_id: str, key: str, holder: IdempotencyHolder, turn_id: str, response: Mapping[str, Any]
    ) -> bool:
        async with self._transaction() as db:
            return await idempotency.complete(
                db, tenant_id=tenant_id, key=key, holder=holder, turn_id=turn_id, response=response
            )

    async def release_idempotency_key(self, *, tenant_id: str, key: str, holder: IdempotencyHolder) -> None:
        async with self._transaction() as db:
            await idempotency.release(db, tenant_id=tenant_id, key=key, holder=holder)

    async def delete_idempotency_keys(self, *, created_before: datetime) -> int:
        async with self._transaction() as db:
            return await idempotency.delete_older_than(db, cv.aware(created_before, "created_before"))


class SqlInstances(StoreTransactions):
    """`InstancesStore` on SQL."""

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
        async with self._transaction() as db:
            return await instances.claim(
                db,
                self._backend,
                instance_id=instance_id,
                run=run,
                host=host,
                pid=pid,
                now=self._clock(),
                stale_before=cv.aware(stale_before, "stale_before"),
                holder_dead=holder_dead,
            )

    async def heartbeat_instance(self, instance_id: str, *, run: str) -> bool:
        async with self._transaction() as db:
            return await instances.heartbeat(db, instance_id=instance_id, run=run, now=self._clock())

    async def release_instance(self, instance_id: str, *, run: str) -> None:
        async with self._transaction() as db:
            await instances.release(db, instance_id=instance_id, run=run)


def _implements_protocols(
    m0: SqlWorkers, m1: SqlApiKeys, m2: SqlTenants, m3: SqlIdempotency, m4: SqlInstances
) -> tuple[WorkersStore, ApiKeysStore, TenantsStore, IdempotencyStore, InstancesStore]:
    return m0, m1, m2, m3, m4  # mypy checks that each mixin satisfies its aggregate's Protocol
