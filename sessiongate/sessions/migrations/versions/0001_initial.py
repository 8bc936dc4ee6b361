"""Initial schema: tenants, sessions, turns, tool_calls, advisories, workers; the "default" tenant.

This is 0001 as first committed (180f161). Until 0002 this file was edited in place three times (8258f54,
d1f04ef, 9587d80), so a database stamped 0001 may hold any of those four schemas; 0002 brings each of them to the
same head. Never edit a committed revision again: add one.

Revision ID: 0001
Revises:
Create Date: 2025-11-22
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Self-contained on purpose: a migration must not change when the models do.
Timestamp = sa.DateTime(timezone=True)
NullableJSON = sa.JSON(none_as_null=True)


def upgrade() -> None:
    tenants = op.create_table(
        "tenants",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("last_active_at", Timestamp, nullable=False),
        sa.Column("turn_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_sessions_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_index(op.f("ix_sessions_tenant_id_last_active_at"), "sessions", ["tenant_id", "last_active_at"])
    op.create_table(
        "turns",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("input_messages", sa.JSON(), nullable=False),
        sa.Column("context_reset", sa.Boolean(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("output_message", NullableJSON, nullable=True),
        sa.Column("finish_reason", sa.String(64), nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("worker", sa.String(256), nullable=True),
        sa.Column("error", NullableJSON, nullable=True),
        sa.Column("received_at", Timestamp, nullable=False),
        sa.Column("dispatched_at", Timestamp, nullable=True),
        sa.Column("first_token_at", Timestamp, nullable=True),
        sa.Column("ended_at", Timestamp, nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens_details", NullableJSON, nullable=True),
        sa.Column("cached_device", sa.Integer(), nullable=True),
        sa.Column("cached_host", sa.Integer(), nullable=True),
        sa.Column("cached_storage", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_turns_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turns")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_turns_session_id_seq")),
    )
    op.create_index(op.f("ix_turns_status_received_at"), "turns", ["status", "received_at"])
    op.create_table(
        "tool_calls",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("turn_id", sa.String(64), nullable=False),
        sa.Column("call_id", sa.String(256), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("requested_at", Timestamp, nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("returned_at", Timestamp, nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column("result_source", sa.String(16), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_tool_calls_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_tool_calls_turn_id_turns"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_calls")),
        sa.UniqueConstraint("session_id", "call_id", name=op.f("uq_tool_calls_session_id_call_id")),
    )
    op.create_index(op.f("ix_tool_calls_turn_id"), "tool_calls", ["turn_id"])
    op.create_table(
        "advisories",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("target_worker", sa.String(256), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("resolved_at", Timestamp, nullable=True),
        sa.Column("turn_id", sa.String(64), nullable=True),
        sa.Column("detail", NullableJSON, nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_advisories_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["turns.id"], name=op.f("fk_advisories_turn_id_turns"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_advisories")),
    )
    op.create_index(op.f("ix_advisories_session_id_created_at"), "advisories", ["session_id", "created_at"])
    op.create_index(op.f("ix_advisories_outcome_expires_at"), "advisories", ["outcome", "expires_at"])
    op.create_table(
        "workers",
        sa.Column("id", sa.String(256), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("last_seen_at", Timestamp, nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )

    # Naive UTC on SQLite (as the models store it), timestamptz on PostgreSQL.
    now = datetime.now(UTC)
    if op.get_bind().dialect.name == "sqlite":
        now = now.replace(tzinfo=None)
    op.bulk_insert(tenants, [{"id": "default", "name": "default", "created_at": now}])


def downgrade() -> None:
    op.drop_table("workers")
    op.drop_index(op.f("ix_advisories_outcome_expires_at"), table_name="advisories")
    op.drop_index(op.f("ix_advisories_session_id_created_at"), table_name="advisories")
    op.drop_table("advisories")
    op.drop_index(op.f("ix_tool_calls_turn_id"), table_name="tool_calls")
    op.drop_table("tool_calls")
    op.drop_index(op.f("ix_turns_status_received_at"), table_name="turns")
    op.drop_table("turns")
    op.drop_index(op.f("ix_sessions_tenant_id_last_active_at"), table_name="sessions")
    op.drop_table("sessions")
    op.drop_table("tenants")
