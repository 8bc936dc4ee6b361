"""`SessionStore`: the seam between the gateway and the session store (`SqlSessionStore` implements it).

All methods are coroutines, safe to call concurrently, each its own committed transaction. Every method
that names a session takes the caller's `tenant_id` and raises `SessionNotFound` for another tenant's
session. Datetimes must be timezone-aware (naive ones raise `ValueError`); the store returns UTC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from .records import (
    AdvisoryRecord,
    ApiKeyRecord,
    IdempotencyRecord,
    InstanceLease,
    MissedTurn,
    Page,
    ResponseRecord,
    SessionRecord,
    TenantRecord,
    ToolCallRecord,
    TurnRecord,
    WorkerRecord,
)

__all__ = ["SessionStore"]


class SessionStore(Protocol):
    # sessions
    async def create_session(
        self,
        *,
        tenant_id: str = "default",
        session_id: str | None = None,
        priority: int = 0,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionRecord:
        """A new active session (`sess_` + 24 hex when no id is given); `SessionExists` if the id is taken."""
        ...

    async def get_session(self, session_id: str, *, tenant_id: str) -> SessionRecord: ...

    async def get_or_create_session(self, session_id: str, *, tenant_id: str) -> tuple[SessionRecord, bool]:
        """The session and whether this call created it; concurrent calls agree on one row.

        `SessionExists` if the id belongs to another tenant."""
        ...

    async def list_sessions(
        self, *, tenant_id: str, limit: int = 20, after: str | None = None, state: str | None = None
    ) -> Page[SessionRecord]:
        """Newest first (created_at desc, then id); `after` is the last id of the previous page."""
        ...

    async def update_session(
        self,
        session_id: str,
        *,
        tenant_id: str,
        priority: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        state: str | None = None,
    ) -> SessionRecord:
        """Change the fields given (None leaves one as it is); `metadata` replaces the whole dict."""
        ...

    async def delete_session(self, session_id: str, *, tenant_id: str) -> None:
        """Delete the session with its turns, tool calls and advisories."""
        ...

    async def session_context(self, session_id: str, *, tenant_id: str) -> list[dict[str, Any]]:
        """The conversation so far, as the model saw it (see `sessions.history`)."""
        ...

    async def find_extended_sessions(
        self, *, tenant_id: str, contexts: Sequence[tuple[str, int]], limit: int = 2
    ) -> list[tuple[str, int]]:
        """The tenant's active sessions whose context is one of `contexts` ((digest, length in messages)), as
        (session id, context length), longest context first, at most `limit` of the longest length."""
        ...

    async def fork_session(
        self,
        parent_id: str,
        *,
        tenant_id: str,
        child_id: str | None = None,
        at_seq: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[SessionRecord, int]:
        """A new session of the tenant sharing the parent's context up to its turn `at_seq` (all of it by default):
        the child and the number of context messages shared. `TurnNotFound` for a seq that is not an ok turn."""
        ...

    async def record_prefix_break(self, turn_id: str, *, session_id: str, detail: Mapping[str, Any]) -> None:
        """Note on the turn where its resent history broke the session's context prefix, and count it."""
        ...

    # Responses API responses
    async def create_response(
        self,
        response_id: str,
        *,
        tenant_id: str,
        session_id: str,
        turn_id: str,
        previous_response_id: str | None,
        instructions: str | None,
        input_items: Sequence[Mapping[str, Any]],
        body: Mapping[str, Any],
    ) -> ResponseRecord:
        """Store a response as the turn `turn_id` of the session `session_id`."""
        ...

    async def get_response(self, response_id: str, *, tenant_id: str) -> ResponseRecord:
        """The tenant's response; `ResponseNotFound` for another tenant's, as for one that does not exist."""
        ...

    async def response_context(
        self, response_id: str, *, tenant_id: str
    ) -> tuple[ResponseRecord, list[dict[str, Any]]]:
        """The response and its session's context as it stood after its turn (what the next response continues)."""
        ...

    async def delete_response(self, response_id: str, *, tenant_id: str) -> tuple[ResponseRecord, bool]:
        """Delete the response; the record, and whether it was its session's latest response."""
        ...

    # administration (across tenants)
    async def find_session(self, session_id: str) -> SessionRecord:
        """The session whatever its tenant (the admin API's lookup); `SessionNotFound` if there is none."""
        ...

    async def search_sessions(
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
        min_prefix_breaks: int | None = None,
    ) -> Page[SessionRecord]:
        """Sessions of any or one tenant matching every filter given, most recently active first (then id);
        `after` is the last id of the previous page."""
        ...

    # turns
    async def begin_turn(
        self,
        session_id: str,
        *,
        tenant_id: str,
        messages: Sequence[Mapping[str, Any]],
        request: Mapping[str, Any],
        received_at: datetime,
        create_session: bool = False,
        gateway_instance: str | None = None,
        gateway_run: str | None = None,
        session_source: str | None = None,
    ) -> TurnRecord:
        """Record a request as a pending turn, storing only the messages new to the context, and the tool
        results among them. `InvalidTransition` if the session is closed.

        `create_session=True` creates a missing session in the same transaction, as `get_or_create_session`
        would (concurrent first turns of one id all succeed, one of them creating it; `SessionExists` if the
        id belongs to another tenant). `gateway_instance`/`gateway_run` name the gateway process serving it
        (see `fail_pending_turns`)."""
        ...

    async def mark_dispatched(self, turn_id: str, *, worker: str, dispatched_at: datetime) -> None: ...

    async def complete_turn(
        self,
        turn_id: str,
        *,
        output_message: Mapping[str, Any],
        finish_reason: str | None,
        model: str | None,
        usage: Mapping[str, Any] | None = None,
        cached_tokens_details: Mapping[str, Any] | None = None,
        first_token_at: datetime | None = None,
        ended_at: datetime,
        worker: str | None = None,
        dispatched_at: datetime | None = None,
    ) -> TurnRecord:
        """Mark a pending turn ok with its answer; records the tool calls the answer requests.

        `worker` and `dispatched_at` may be given here instead of through `mark_dispatched` (one write
        less per request); None keeps what is stored."""
        ...

    async def fail_turn(
        self,
        turn_id: str,
        *,
        status: str = "failed",
        error_type: str,
        error_message: str,
        ended_at: datetime,
        partial_output: Mapping[str, Any] | None = None,
        first_token_at: datetime | None = None,
        worker: str | None = None,
        dispatched_at: datetime | None = None,
    ) -> TurnRecord:
        """End a pending turn as "failed" or "cancelled"; it keeps its input but leaves the context.

        `partial_output` is stored as the turn's output_message; `worker`/`dispatched_at` as in `complete_turn`."""
        ...

    async def list_turns(
        self, session_id: str, *, tenant_id: str, limit: int = 100, after_seq: int | None = None
    ) -> list[TurnRecord]:
        """Turns in seq order (those after `after_seq`), each with its tool calls and its settled advisory."""
        ...

    async def fail_pending_turns(
        self,
        *,
        older_than: datetime | None = None,
        error_message: str,
        error_type: str = "interrupted",
        gateway_instance: str | None = None,
        except_run: str | None = None,
    ) -> int:
        """Fail the turns still pending (received before `older_than`); returns how many.

        With `gateway_instance`, only that replica's turns, and with `except_run` not those of its current run:
        what a restarted replica calls to fail its dead predecessor's turns at once, leaving other replicas'
        turns alone."""
        ...

    # tool calls
    async def record_tool_result(
        self, session_id: str, call_id: str, *, tenant_id: str, content: str, returned_at: datetime
    ) -> ToolCallRecord:
        """A tool result posted through the API. Posting the same content again returns the call unchanged;
        different content for a returned call is `InvalidTransition`."""
        ...

    async def pending_tool_calls(self, session_id: str, *, tenant_id: str) -> list[ToolCallRecord]: ...

    # advisories
    async def create_advisory(
        self,
        session_id: str,
        *,
        tenant_id: str,
        kind: str,
        target_worker: str | None,
        created_at: datetime,
        expires_at: datetime,
        detail: Mapping[str, Any] | None = None,
        outcome: str = "pending",
        resolved_at: datetime | None = None,
        turn_id: str | None = None,
    ) -> AdvisoryRecord:
        """A new advisory, pending; or already settled (`outcome` and `resolved_at`), in one write."""
        ...

    async def record_missed_turns(self, missed: Sequence[MissedTurn]) -> int:
        """Record follow-up turns that no advisory foresaw (advisories of kind "none", settled `missed`), in one
        write; turns of sessions that are gone are skipped. The number recorded."""
        ...

    async def resolve_advisory(
        self, advisory_id: str, *, outcome: str, resolved_at: datetime, turn_id: str | None = None
    ) -> AdvisoryRecord:
        """Settle a pending advisory; `InvalidTransition` if it was already resolved."""
        ...

    async def list_advisories(
        self, session_id: str, *, tenant_id: str, outcome: str | None = None, limit: int = 100
    ) -> list[AdvisoryRecord]: ...

    # workers
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

    # API keys (the store sees only hashes: see `sessions.keys`)
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

    # tenants
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

    # idempotency keys (see `sessions.idempotency`)
    async def claim_idempotency_key(
        self, *, tenant_id: str, key: str, request_hash: str, now: datetime, stale_before: datetime
    ) -> IdempotencyRecord | None:
        """None if this caller now holds the key; else the existing claim (pending, or done with a response)."""
        ...

    async def complete_idempotency_key(
        self, *, tenant_id: str, key: str, turn_id: str, response: Mapping[str, Any]
    ) -> None: ...

    async def release_idempotency_key(self, *, tenant_id: str, key: str) -> None:
        """Forget a pending claim (its request failed), so a retry runs anew."""
        ...

    async def delete_idempotency_keys(self, *, created_before: datetime) -> int:
        """Delete the keys claimed before `created_before` (past the retention); how many were deleted."""
        ...

    # gateway instance leases (see `sessions.instances`)
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

    # lifecycle
    async def ping(self) -> None:
        """A cheap round trip to the database; `StoreUnavailable` if it does not answer."""
        ...

    async def close(self) -> None: ...
