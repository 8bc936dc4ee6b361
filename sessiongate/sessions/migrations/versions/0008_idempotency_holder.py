"""Idempotency keys record the gateway process that holds them, so a dead holder's claim is taken over at once.

`idempotency_keys.holder_instance` and `holder_run`: the instance id and run of the gateway that claimed (or took
over) the key, matched against `gateway_instances` when a retry finds the key pending. NULL on the keys claimed
before: those are taken over only once older than the caller's staleness bound, as before.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.add_column(sa.Column("holder_instance", sa.String(256), nullable=True))
        batch.add_column(sa.Column("holder_run", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.drop_column("holder_run")
        batch.drop_column("holder_instance")
