"""Prefix breaks: where a turn's resent history first differed from its session's stored context, and a count.

`turns.prefix_break` (JSON: message index, kind, tokens kept and lost; NULL on a turn that extended the context)
and `sessions.prefix_breaks` (how many of its turns broke the prefix), so the admin API can list sessions by it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("prefix_break", sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("prefix_breaks", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("prefix_breaks")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("prefix_break")
