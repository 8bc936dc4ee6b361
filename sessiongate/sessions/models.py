"""The ORM tables of the session store: tenants, API keys, sessions, turns, tool calls, advisories, workers.

Every timestamp is an aware UTC datetime (`UTCDateTime` stores naive UTC on SQLite, `timestamptz` on
PostgreSQL). Relationships are `lazy="raise"`: load them explicitly with `selectinload` or not at all.
Deletes cascade in the database (`ON DELETE CASCADE`), so a session is removed with one statement.
These classes never leave the package: the store returns the frozen records of `records.py`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from .history import EMPTY_DIGEST

__all__ = [
    "Advisory",
    "ApiKey",
    "Base",
    "IdempotencyKey",
    "ResponseRow",
    "Session",
    "Tenant",
    "ToolCall",
    "Turn",
    "UTCDateTime",
    "Worker",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on every backend; binding a naive datetime is an error."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: the store only accepts timezone-aware datetimes")
        value = value.astimezone(UTC)
        # SQLite has no time zones: store the UTC wall time, which also keeps string comparison correct.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# JSON columns that may be absent store SQL NULL (not the JSON literal `null`) for Python None.
NullableJSON = JSON(none_as_null=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON(), list[dict[str, Any]]: JSON()}


class Tenant(Base):
    """A tenant; its limits override the gateway's global ones where set (None: the global value; 0: none)."""

    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime]
    max_concurrent: Mapped[int | None]
    tokens_per_minute: Mapped[int | None]


class ApiKey(Base):
    """A tenant's client key, stored as the sha256 of the secret (the secret itself is shown once, never kept).

    `prefix` (the secret's first characters) lets people tell keys apart in listings and logs.
    """

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("secret_hash"), Index(None, "tenant_id", "created_at"))

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(256))
    prefix: Mapped[str] = mapped_column(String(32))
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class IdempotencyKey(Base):
    """A client's `Idempotency-Key` on a chat request, per tenant: the request's hash, the gateway process holding
    it (its instance id and run, as in `gateway_instances`), and once the turn ended well, its turn and the
    response to replay. A pending row is a request in progress, or one whose gateway died: it may be taken over
    once its holder's instance lease is gone or stale, or once older than the caller's staleness bound
    (`sessions.idempotency`). The holder is NULL on rows claimed before it was recorded (revision 0008)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index(None, "created_at"),)

    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    turn_id: Mapped[str | None] = mapped_column(String(64), ForeignKey("turns.id", ondelete="CASCADE"))
    response: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    holder_instance: Mapped[str | None] = mapped_column(String(256))
    holder_run: Mapped[str | None] = mapped_column(String(64))


class Session(Base):
    __tablename__ = "sessions"
    # (tenant_id, context_digest): a request that names no session is matched to the session whose context it
    # extends (`find_extended_sessions`).
    __table_args__ = (Index(None, "tenant_id", "last_active_at"), Index(None, "tenant_id", "context_digest"))

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128), ForeignKey("tenants.id"))
    state: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int]
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata")
    created_at: Mapped[datetime]
    last_active_at: Mapped[datetime]
    turn_count: Mapped[int]
    # The context (see `history`) as a chained digest of its normalised messages, how many messages it has, and
    # the highest seq among the ok turns folded into it: `begin_turn` compares a request with these instead of
    # reading the turns back.
    context_digest: Mapped[str] = mapped_column(String(64), default=EMPTY_DIGEST)
    context_length: Mapped[int] = mapped_column(default=0)
    context_seq: Mapped[int] = mapped_column(default=0)
    # How many of its turns broke the context's prefix (`prefix_breaks.py`).
    prefix_breaks: Mapped[int] = mapped_column(default=0, server_default=text("0"))

    turns: Mapped[list[Turn]] = relationship(
        back_populates="session", lazy="raise", passive_deletes=True, order_by="Turn.seq"
    )


_PENDING = text("status = 'pending'")


class Turn(Base):
    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("session_id", "seq"),
        # The turns still pending, by arrival (what `fail_pending_turns` looks for). Partial: a turn enters it when
        # it begins and leaves when it ends, so the index holds the turns in flight, not every turn ever served.
        Index("ix_turns_pending_received_at", "received_at", sqlite_where=_PENDING, postgresql_where=_PENDING),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(128), ForeignKey("sessions.id", ondelete="CASCADE"))
    seq: Mapped[int]
    status: Mapped[str] = mapped_column(String(16))
    input_messages: Mapped[list[dict[str, Any]]]
    context_reset: Mapped[bool]
    request: Mapped[dict[str, Any]]
    output_message: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    finish_reason: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(256))
    worker: Mapped[str | None] = mapped_column(String(256))
    error: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    received_at: Mapped[datetime]
    dispatched_at: Mapped[datetime | None]
    first_token_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    prompt_tokens: Mapped[int | None]
    completion_tokens: Mapped[int | None]
    cached_tokens: Mapped[int | None]
    cached_tokens_details: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    cached_device: Mapped[int | None]
    cached_host: Mapped[int | None]
    cached_storage: Mapped[int | None]
    # The gateway replica that serves the turn (a stable name) and its process run (new at every start): a
    # restarted replica fails the pending turns of its earlier runs at once; other replicas' turns are not its own.
    gateway_instance: Mapped[str | None] = mapped_column(String(128))
    gateway_run: Mapped[str | None] = mapped_column(String(32))
    # How the request named its session: "header", "body", "inferred" (no name: its messages extended this
    # session's context, `gateway/turn/implicit.py`), "response" (a Responses API chain), "new" (none: a new session).
    session_source: Mapped[str | None] = mapped_column(String(16))
    # Where its resent history first differed from the stored context (`prefix_breaks.PrefixBreak`); None if not.
    prefix_break: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)

    session: Mapped[Session] = relationship(back_populates="turns", lazy="raise")
    tool_calls: Mapped[list[ToolCall]] = relationship(
        back_populates="turn", lazy="raise", passive_deletes=True, order_by="ToolCall.id"
    )


class ToolCall(Base):
    __tablename__ = "tool_calls"
    __table_args__ = (UniqueConstraint("session_id", "call_id"), Index(None, "turn_id"))

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(128), ForeignKey("sessions.id", ondelete="CASCADE"))
    turn_id: Mapped[str] = mapped_column(String(64), ForeignKey("turns.id", ondelete="CASCADE"))
    call_id: Mapped[str] = mapped_column(String(256))
    name: Mapped[str] = mapped_column(String(256))
    arguments: Mapped[str] = mapped_column(Text)
    requested_at: Mapped[datetime]
    result: Mapped[str | None] = mapped_column(Text)
    returned_at: Mapped[datetime | None]
    duration_ms: Mapped[float | None] = mapped_column(Float)
    result_source: Mapped[str | None] = mapped_column(String(16))

    turn: Mapped[Turn] = relationship(back_populates="tool_calls", lazy="raise")


class Advisory(Base):
    __tablename__ = "advisories"
    __table_args__ = (Index(None, "session_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(128), ForeignKey("sessions.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    target_worker: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    outcome: Mapped[str] = mapped_column(String(16))
    resolved_at: Mapped[datetime | None]
    turn_id: Mapped[str | None] = mapped_column(String(64), ForeignKey("turns.id", ondelete="SET NULL"))
    detail: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)


class ResponseRow(Base):
    """A stored Responses API response: the turn it was, in the session its chain is (`gateway/responses/`).

    The response's context is read from the session's turns up to its turn; the row keeps what the turns do not:
    the request's input items (for `input_items`), its `instructions` (not carried to the next response) and the
    response object as it was answered."""

    __tablename__ = "responses"
    __table_args__ = (Index(None, "session_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128))
    session_id: Mapped[str] = mapped_column(String(128), ForeignKey("sessions.id", ondelete="CASCADE"))
    turn_id: Mapped[str] = mapped_column(String(64), ForeignKey("turns.id", ondelete="CASCADE"))
    previous_response_id: Mapped[str | None] = mapped_column(String(64))
    instructions: Mapped[str | None] = mapped_column(Text)
    input_items: Mapped[list[dict[str, Any]]]
    body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    url: Mapped[str] = mapped_column(String(2048))
    state: Mapped[str] = mapped_column(String(16))
    last_seen_at: Mapped[datetime]
    info: Mapped[dict[str, Any]]


class GatewayInstance(Base):
    """The lease of a gateway instance id: held by one process run at a time, kept by its heartbeat, so that two
    live gateways configured with the same id (which would fail each other's in-flight turns) are detected."""

    __tablename__ = "gateway_instances"

    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    run: Mapped[str] = mapped_column(String(64))
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int]
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]
