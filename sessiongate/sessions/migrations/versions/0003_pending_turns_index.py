"""The turns' status index becomes a partial index of the pending turns.

`ix_turns_status_received_at` held every turn ever served, and every turn's end moved its entry (a delete and an
insert in the index). Only the pending turns are ever looked up by it (`fail_pending_turns`), so the new index holds
those alone: a turn enters it when it begins and leaves when it ends, and the index stays the size of what is in
flight. SQLite and PostgreSQL both have partial indexes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    op.drop_index("ix_turns_status_received_at", table_name="turns")
    op.create_index(
        "ix_turns_pending_received_at",
        "turns",
        ["received_at"],
        sqlite_where=_PENDING,
        postgresql_where=_PENDING,
    )


def downgrade() -> None:
    op.drop_index("ix_turns_pending_received_at", table_name="turns")
    op.create_index("ix_turns_status_received_at", "turns", ["status", "received_at"])
