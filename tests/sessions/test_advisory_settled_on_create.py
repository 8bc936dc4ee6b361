"""An advisory created already settled: one store write, same record as two; "missed" records in batches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sessiongate.sessions import AdvisoryRecord, MissedTurn, SqlSessionStore

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def create_advisory(store: SqlSessionStore, session_id: str, **settled: Any) -> AdvisoryRecord:
    """A "none" advisory of the default tenant, created and expiring at T0, settled as `settled` says."""
    return await store.create_advisory(
        session_id, tenant_id="default", kind="none", target_worker=None, created_at=T0, expires_at=T0, **settled
    )


async def test_created_settled_reads_like_created_then_resolved(store: SqlSessionStore) -> None:
    session = await store.create_session()
    turn = await store.begin_turn(
        session.id, tenant_id="default", messages=[{"role": "user", "content": "q"}], request={}, received_at=T0
    )
    created = await create_advisory(
        store, session.id, outcome="missed", resolved_at=T0 + timedelta(seconds=1), turn_id=turn.id
    )
    assert (created.outcome, created.resolved_at, created.turn_id) == ("missed", T0 + timedelta(seconds=1), turn.id)
    assert await store.list_advisories(session.id, tenant_id="default", outcome="missed") == [created]


@pytest.mark.parametrize(
    ("outcome", "resolved_at", "error"),
    [
        ("missed", None, "resolved_at"),
        ("pending", T0, "resolved_at"),
        ("psychic", T0, "outcome"),
    ],
)
async def test_settled_on_create_is_validated(
    store: SqlSessionStore, outcome: str, resolved_at: datetime | None, error: str
) -> None:
    session = await store.create_session()
    with pytest.raises(ValueError, match=error):
        await create_advisory(store, session.id, outcome=outcome, resolved_at=resolved_at)


async def test_missed_turns_are_recorded_together_and_gone_sessions_skipped(store: SqlSessionStore) -> None:
    kept, gone = await store.create_session(), await store.create_session()
    foreign = await store.create_session(tenant_id="other")
    turns = {}
    for session in (kept, gone):
        turns[session.id] = await store.begin_turn(
            session.id, tenant_id="default", messages=[{"role": "user", "content": "q"}], request={}, received_at=T0
        )
    await store.delete_session(gone.id, tenant_id="default")
    missed = [
        MissedTurn(kept.id, "default", turns[kept.id].id, T0),
        MissedTurn(gone.id, "default", turns[gone.id].id, T0),
        MissedTurn(foreign.id, "default", "turn_x", T0),  # the id names another tenant's session
        MissedTurn("sess_never", "default", "turn_y", T0),
    ]
    assert await store.record_missed_turns(missed) == 1
    assert await store.record_missed_turns([]) == 0
    (record,) = await store.list_advisories(kept.id, tenant_id="default")
    assert (record.kind, record.outcome, record.resolved_at) == ("none", "missed", T0)
    assert (record.created_at, record.expires_at, record.target_worker, record.detail) == (T0, T0, None, None)
    assert record.turn_id == turns[kept.id].id
    assert await store.list_advisories(foreign.id, tenant_id="other") == []
