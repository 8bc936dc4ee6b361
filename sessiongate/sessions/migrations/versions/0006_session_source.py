"""Turns record how their request named its session; sessions are found by the context their requests extend.

`turns.session_source`: "header", "body", "inferred" (the request named no session; its messages extended the
session's stored context), "response" (a Responses API chain) or "new". NULL for the turns served before.
`ix_sessions_tenant_id_context_digest`: a request that names no session is matched, by the digest of its leading
messages, to the tenant's session whose context it extends (one index lookup per candidate prefix).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("session_source", sa.String(16), nullable=True))
    op.create_index(op.f("ix_sessions_tenant_id_context_digest"), "sessions", ["tenant_id", "context_digest"])


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_tenant_id_context_digest"), table_name="sessions")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("session_source")
