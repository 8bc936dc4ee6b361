"""The advisories' (outcome, expires_at) index is dropped: no query looks advisories up by it.

Advisories are read by session (`ix_advisories_session_id_created_at`: a session's listing, a turn's settled
advisory) or by id; pending ones expire in the advisor's memory, not by a query. The index only cost an entry per
row written, and the gateway writes one for most turns (the "missed" record of a turn that came without a signal).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_advisories_outcome_expires_at", table_name="advisories")


def downgrade() -> None:
    op.create_index("ix_advisories_outcome_expires_at", "advisories", ["outcome", "expires_at"])
