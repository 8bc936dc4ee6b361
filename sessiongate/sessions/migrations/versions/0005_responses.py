"""The `responses` table: a stored Responses API response, the turn of its chain's session that it was.

A response chain is a session and each response one of its turns; the table maps a response id to that turn and
keeps what the turns do not hold: the request's input items, its instructions (which the next response does not
inherit) and the response object as answered. Deleting the session deletes its responses.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("turn_id", sa.String(64), nullable=False),
        sa.Column("previous_response_id", sa.String(64), nullable=True),
        sa.Column("instructions", sa.Text(), nullable=True),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_responses_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"], name=op.f("fk_responses_turn_id_turns"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_responses")),
    )
    op.create_index(op.f("ix_responses_session_id_created_at"), "responses", ["session_id", "created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_responses_session_id_created_at"), table_name="responses")
    op.drop_table("responses")
