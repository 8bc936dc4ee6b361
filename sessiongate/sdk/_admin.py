"""`client.admin`: the gateway's admin API (`/v1/admin/...`), sync and async. Sent with the admin key.

The admin key is the client's `admin_key` (keyword > `SESSIONGATE_ADMIN_KEY`); without one, admin calls go
with the tenant key and the gateway answers 403 (`PermissionDeniedError`) or 401 (`AuthenticationError`).

    client.admin.sessions.list(tenant_id="acme")     sessions across tenants
    client.admin.sessions.get(id)                    with turns, advisories, believed KV placement
    client.admin.sessions.update(id, priority=5)     .close(id)   .delete(id)   (delete drops its KV first)
    client.admin.sessions.retain_kv(id, ttl_ms=...)  .drop_kv(id) on every routable worker
    client.admin.workers.list()                      .drain(id)   .undrain(id)
    client.admin.advisory_stats()                    outcomes, precision and recall per signal kind
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import TYPE_CHECKING

from . import _endpoints as ep
from ._admin_types import (
    AdminSession,
    AdminSessionDeleted,
    AdvisoryStats,
    KVOperation,
    WorkerInfo,
    parse_admin_deleted,
    parse_admin_session,
    parse_advisory_stats,
    parse_kv_operation,
    parse_worker,
    parse_workers,
)
from ._base import RequestOptions
from ._session_types import SessionInfo, SessionPage, parse_session, parse_session_page

if TYPE_CHECKING:
    from ._client import AsyncSessionGate, SessionGate

__all__ = ["Admin", "AdminSessions", "AdminWorkers", "AsyncAdmin", "AsyncAdminSessions", "AsyncAdminWorkers"]


def _session_filters(
    tenant_id: str | None,
    state: str | None,
    active_after: datetime | None,
    active_before: datetime | None,
    min_priority: int | None,
    max_priority: int | None,
    limit: int,
    after: str | None,
) -> RequestOptions:
    return ep.admin_list_sessions(
        tenant_id=tenant_id,
        state=state,
        active_after=active_after,
        active_before=active_before,
        min_priority=min_priority,
        max_priority=max_priority,
        limit=limit,
        after=after,
    )


class AdminSessions:
    """`client.admin.sessions`: any tenant's sessions."""

    def __init__(self, client: SessionGate) -> None:
        self._client = client

    def list(
        self,
        *,
        tenant_id: str | None = None,
        state: str | None = None,
        active_after: datetime | None = None,
        active_before: datetime | None = None,
        min_priority: int | None = None,
        max_priority: int | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> SessionPage:
        options = _session_filters(
            tenant_id, state, active_after, active_before, min_priority, max_priority, limit, after
        )
        return self._client._request_parsed(options, parse_session_page)

    def get(self, session_id: str) -> AdminSession:
        return self._client._request_parsed(ep.admin_get_session(session_id), parse_admin_session)

    def update(self, session_id: str, *, priority: int) -> SessionInfo:
        return self._client._request_parsed(ep.admin_patch_session(session_id, priority), parse_session)

    def close(self, session_id: str) -> SessionInfo:
        return self._client._request_parsed(ep.admin_close_session(session_id), parse_session)

    def delete(self, session_id: str) -> AdminSessionDeleted:
        return self._client._request_parsed(ep.admin_delete_session(session_id), parse_admin_deleted)

    def retain_kv(self, session_id: str, *, priority: int | None = None, ttl_ms: int | None = None) -> KVOperation:
        return self._client._request_parsed(ep.admin_retain_kv(session_id, priority, ttl_ms), parse_kv_operation)

    def drop_kv(self, session_id: str) -> KVOperation:
        return self._client._request_parsed(ep.admin_drop_kv(session_id), parse_kv_operation)


class AsyncAdminSessions:
    """`client.admin.sessions` of `AsyncSessionGate`."""

    def __init__(self, client: AsyncSessionGate) -> None:
        self._client = client

    async def list(
        self,
        *,
        tenant_id: str | None = None,
        state: str | None = None,
        active_after: datetime | None = None,
        active_before: datetime | None = None,
        min_priority: int | None = None,
        max_priority: int | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> SessionPage:
        options = _session_filters(
            tenant_id, state, active_after, active_before, min_priority, max_priority, limit, after
        )
        return await self._client._request_parsed(options, parse_session_page)

    async def get(self, session_id: str) -> AdminSession:
        return await self._client._request_parsed(ep.admin_get_session(session_id), parse_admin_session)

    async def update(self, session_id: str, *, priority: int) -> SessionInfo:
        return await self._client._request_parsed(ep.admin_patch_session(session_id, priority), parse_session)

    async def close(self, session_id: str) -> SessionInfo:
        return await self._client._request_parsed(ep.admin_close_session(session_id), parse_session)

    async def delete(self, session_id: str) -> AdminSessionDeleted:
        return await self._client._request_parsed(ep.admin_delete_session(session_id), parse_admin_deleted)

    async def retain_kv(
        self, session_id: str, *, priority: int | None = None, ttl_ms: int | None = None
    ) -> KVOperation:
        options = ep.admin_retain_kv(session_id, priority, ttl_ms)
        return await self._client._request_parsed(options, parse_kv_operation)

    async def drop_kv(self, session_id: str) -> KVOperation:
        return await self._client._request_parsed(ep.admin_drop_kv(session_id), parse_kv_operation)


class AdminWorkers:
    """`client.admin.workers`: health and load; drain (no new requests routed there) and undrain."""

    def __init__(self, client: SessionGate) -> None:
        self._client = client

    def list(self) -> builtins.list[WorkerInfo]:
        return self._client._request_parsed(ep.admin_list_workers(), parse_workers)

    def drain(self, worker_id: str) -> WorkerInfo:
        return self._client._request_parsed(ep.admin_set_draining(worker_id, True), parse_worker)

    def undrain(self, worker_id: str) -> WorkerInfo:
        return self._client._request_parsed(ep.admin_set_draining(worker_id, False), parse_worker)


class AsyncAdminWorkers:
    """`client.admin.workers` of `AsyncSessionGate`."""

    def __init__(self, client: AsyncSessionGate) -> None:
        self._client = client

    async def list(self) -> builtins.list[WorkerInfo]:
        return await self._client._request_parsed(ep.admin_list_workers(), parse_workers)

    async def drain(self, worker_id: str) -> WorkerInfo:
        return await self._client._request_parsed(ep.admin_set_draining(worker_id, True), parse_worker)

    async def undrain(self, worker_id: str) -> WorkerInfo:
        return await self._client._request_parsed(ep.admin_set_draining(worker_id, False), parse_worker)


class Admin:
    """`client.admin`."""

    def __init__(self, client: SessionGate) -> None:
        self._client = client
        self.sessions = AdminSessions(client)
        self.workers = AdminWorkers(client)

    def advisory_stats(self) -> AdvisoryStats:
        return self._client._request_parsed(ep.admin_advisory_stats(), parse_advisory_stats)


class AsyncAdmin:
    """`client.admin` of `AsyncSessionGate`."""

    def __init__(self, client: AsyncSessionGate) -> None:
        self._client = client
        self.sessions = AsyncAdminSessions(client)
        self.workers = AsyncAdminWorkers(client)

    async def advisory_stats(self) -> AdvisoryStats:
        return await self._client._request_parsed(ep.admin_advisory_stats(), parse_advisory_stats)
