"""Reconcile every schema stamped 0001 with the models: api_keys, idempotency_keys, gateway_instances; the tenants'
limits, the sessions' context digest, the turns' gateway instance and run.

0001 was edited in place after it was first committed, so databases stamped 0001 differ by when they were made:
  180f161  the tables of 0001 as it is now (restored to this first version)
  8258f54  + sessions.context_digest, context_length, context_seq
  d1f04ef  + api_keys (and its index), tenants.max_concurrent, tokens_per_minute, idempotency_keys (and its index)
  9587d80  + turns.gateway_instance, gateway_run; gateway_instances
This revision looks at what the database has and adds only what is missing, so all four reach the same schema.
The context columns of sessions made before 8258f54 are computed from their turns (the definition the store compares
requests with, `sessions.history`, copied below as it was when this revision was written), so their next request is
stored as a delta, not whole.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Self-contained on purpose, as 0001: a migration must not change when the models do, nor when `sessions.history`
# does (tests/sessions/test_migrations_self_contained.py checks that no revision imports the project).
Timestamp = sa.DateTime(timezone=True)
NullableJSON = sa.JSON(none_as_null=True)


# The context and its digest, frozen: `sessiongate/sessions/history.py` as of 0427dd1 (the functions the backfill
# calls and what they call, verbatim but for their names). A later change to that definition needs a revision of its
# own that recomputes the stored digests, not an edit of this one.

_NormalisedMessage = tuple[str, str, tuple[tuple[str, str, str], ...], str | None]

_EMPTY_DIGEST = ""  # the digest of an empty context


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            else:
                pieces.append(_canonical_json(part))
        return "".join(pieces)
    return _canonical_json(content)


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _canonical_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return _canonical_json(json.loads(arguments))
        except ValueError:
            return arguments
    if arguments is None:
        return ""
    return _canonical_json(arguments)


def _tool_calls(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call for call in calls if isinstance(call, Mapping)]


def _normalise_message(message: Mapping[str, Any]) -> _NormalisedMessage:
    role, content = message.get("role"), message.get("content")
    if type(role) is str and type(content) is str and "tool_calls" not in message and "tool_call_id" not in message:
        return (role, content, (), None)
    return _normalise_any(message)


def _normalise_any(message: Mapping[str, Any]) -> _NormalisedMessage:
    calls = []
    for call in _tool_calls(message):
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        calls.append(
            (
                str(call.get("id") or ""),
                str(function.get("name") or ""),
                _canonical_arguments(function.get("arguments")),
            )
        )
    tool_call_id = message.get("tool_call_id")
    return (
        str(message.get("role") or ""),
        _content_text(message.get("content")),
        tuple(calls),
        str(tool_call_id) if tool_call_id is not None else None,
    )


def _context_messages(turns: Iterable[Any]) -> list[dict[str, Any]]:
    """The session's context from its turns in seq order (turns that are not "ok" are skipped)."""
    context: list[dict[str, Any]] = []
    for turn in turns:
        if turn.status != "ok":
            continue
        if turn.context_reset:
            context = []
        context.extend(dict(message) for message in turn.input_messages)
        if turn.output_message is not None:
            context.append(dict(turn.output_message))
    return context


def _extend_normalised(digest: str, normalised: Iterable[_NormalisedMessage]) -> str:
    state = bytes.fromhex(digest)
    for message in normalised:
        step = hashlib.sha256(state)
        step.update(_digest_json(message))
        state = step.digest()
    return state.hex()


def _digest_json(normalised: _NormalisedMessage) -> bytes:
    try:
        return orjson.dumps(normalised)
    except orjson.JSONEncodeError:
        return json.dumps(normalised).encode()


def _context_digest(messages: Iterable[Mapping[str, Any]]) -> str:
    """sha256 chained over the normalised messages, from the empty context (hex; "" for no messages)."""
    return _extend_normalised(_EMPTY_DIGEST, map(_normalise_message, messages))


def _nullable_columns() -> list[tuple[str, sa.Column[Any]]]:
    return [
        ("tenants", sa.Column("max_concurrent", sa.Integer(), nullable=True)),
        ("tenants", sa.Column("tokens_per_minute", sa.Integer(), nullable=True)),
        ("turns", sa.Column("gateway_instance", sa.String(128), nullable=True)),
        ("turns", sa.Column("gateway_run", sa.String(32), nullable=True)),
    ]


def _context_columns() -> list[sa.Column[Any]]:
    """NOT NULL, so added with a server default that makes existing rows valid until the backfill sets them."""
    return [
        sa.Column("context_digest", sa.String(64), nullable=False, server_default=_EMPTY_DIGEST),
        sa.Column("context_length", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("context_seq", sa.Integer(), nullable=False, server_default="0"),
    ]


def _create_missing_tables(existing: set[str]) -> None:
    if "api_keys" not in existing:
        op.create_table(
            "api_keys",
            sa.Column("id", sa.String(64), nullable=False),
            sa.Column("tenant_id", sa.String(128), nullable=False),
            sa.Column("name", sa.String(256), nullable=False),
            sa.Column("prefix", sa.String(32), nullable=False),
            sa.Column("secret_hash", sa.String(64), nullable=False),
            sa.Column("created_at", Timestamp, nullable=False),
            sa.Column("revoked_at", Timestamp, nullable=True),
            sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants")),
            sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
            sa.UniqueConstraint("secret_hash", name=op.f("uq_api_keys_secret_hash")),
        )
    if "idempotency_keys" not in existing:
        op.create_table(
            "idempotency_keys",
            sa.Column("tenant_id", sa.String(128), nullable=False),
            sa.Column("key", sa.String(256), nullable=False),
            sa.Column("request_hash", sa.String(64), nullable=False),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("created_at", Timestamp, nullable=False),
            sa.Column("turn_id", sa.String(64), nullable=True),
            sa.Column("response", NullableJSON, nullable=True),
            sa.ForeignKeyConstraint(
                ["turn_id"], ["turns.id"], name=op.f("fk_idempotency_keys_turn_id_turns"), ondelete="CASCADE"
            ),
            sa.PrimaryKeyConstraint("tenant_id", "key", name=op.f("pk_idempotency_keys")),
        )
    if "gateway_instances" not in existing:
        op.create_table(
            "gateway_instances",
            sa.Column("id", sa.String(256), nullable=False),
            sa.Column("run", sa.String(64), nullable=False),
            sa.Column("host", sa.String(256), nullable=False),
            sa.Column("pid", sa.Integer(), nullable=False),
            sa.Column("started_at", Timestamp, nullable=False),
            sa.Column("heartbeat_at", Timestamp, nullable=False),
            sa.PrimaryKeyConstraint("id", name=op.f("pk_gateway_instances")),
        )


def _create_missing_indexes(inspector: sa.Inspector) -> None:
    for table, columns in (("api_keys", ["tenant_id", "created_at"]), ("idempotency_keys", ["created_at"])):
        name = op.f(f"ix_{table}_{'_'.join(columns)}")
        if name not in {index["name"] for index in inspector.get_indexes(table)}:
            op.create_index(name, table, columns)


def _backfill_context(bind: sa.Connection) -> None:
    """The context digest, length and last folded seq of every session, from its ok turns (as the store keeps
    them: see `sessions.turn_write.persist`)."""
    turns = sa.table(
        "turns",
        sa.column("session_id", sa.String()),
        sa.column("seq", sa.Integer()),
        sa.column("status", sa.String()),
        sa.column("context_reset", sa.Boolean()),
        sa.column("input_messages", sa.JSON()),
        sa.column("output_message", NullableJSON),
    )
    sessions = sa.table(
        "sessions",
        sa.column("id", sa.String()),
        sa.column("context_digest", sa.String()),
        sa.column("context_length", sa.Integer()),
        sa.column("context_seq", sa.Integer()),
    )
    with_turns = bind.execute(sa.select(turns.c.session_id).where(turns.c.status == "ok").distinct()).scalars()
    for session_id in list(with_turns):
        c = turns.c
        rows = bind.execute(
            sa.select(c.seq, c.status, c.context_reset, c.input_messages, c.output_message)
            .where(c.session_id == session_id, c.status == "ok")
            .order_by(c.seq)
        ).all()
        messages = _context_messages(rows)
        bind.execute(
            sessions.update()
            .where(sessions.c.id == session_id)
            .values(
                context_digest=_context_digest(messages),
                context_length=len(messages),
                context_seq=max(row.seq for row in rows),
            )
        )


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    _create_missing_tables(set(inspector.get_table_names()))
    _create_missing_indexes(sa.inspect(bind))
    for table, column in _nullable_columns():
        if column.name not in {c["name"] for c in inspector.get_columns(table)}:
            op.add_column(table, column)
    have = {c["name"] for c in inspector.get_columns("sessions")}
    missing_context = [column for column in _context_columns() if column.name not in have]
    for column in missing_context:
        op.add_column("sessions", column)
    if missing_context:
        _backfill_context(bind)


def downgrade() -> None:
    """Back to 0001 as first committed: whatever a database had beyond it, from this revision or an in-place
    edit of 0001, is dropped."""
    op.drop_table("gateway_instances")
    op.drop_index(op.f("ix_idempotency_keys_created_at"), table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_index(op.f("ix_api_keys_tenant_id_created_at"), table_name="api_keys")
    op.drop_table("api_keys")
    for table, column in _nullable_columns():
        op.drop_column(table, column.name)
    for column in _context_columns():
        op.drop_column("sessions", column.name)
