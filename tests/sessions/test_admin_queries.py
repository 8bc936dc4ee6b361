"""The store's cross-tenant queries for the admin API, on SQLite and PostgreSQL; a missed advisory's kind."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sessiongate.sessions import SessionNotFound, SqlSessionStore

pytestmark = pytest.mark.anyio

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


async def test_find_session_whatever_its_tenant(store: SqlSessionStore) -> None:
    await store.create_session(tenant_id="acme", session_id="theirs")
    found = await store.find_session("theirs")
    assert found.tenant_id == "acme"
    with pytest.raises(SessionNotFound):
        await store.find_session("nobody")


async def test_search_sessions_filters_and_pages(store: SqlSessionStore) -> None:
    await store.create_session(tenant_id="acme", session_id="a1", priority=5)
    await store.create_session(tenant_id="acme", session_id="a2", priority=-1)
    await store.create_session(tenant_id="default", session_id="d1")
    await store.update_session("a2", tenant_id="acme", state="closed")

    async def ids(**filters: object) -> list[str]:
        page = await store.search_sessions(**filters)  # type: ignore[arg-type]
        return [s.id for s in page.items]

    assert set(await ids()) == {"a1", "a2", "d1"}
    assert set(await ids(tenant_id="acme")) == {"a1", "a2"}
    assert await ids(state="closed") == ["a2"]
    assert await ids(min_priority=1) == ["a1"]
    assert set(await ids(max_priority=0)) == {"a2", "d1"}
    assert await ids(active_after=datetime.now(UTC) + timedelta(days=1)) == []
    assert set(await ids(active_before=datetime.now(UTC) + timedelta(days=1))) == {"a1", "a2", "d1"}
    first = await store.search_sessions(limit=2)
    assert first.has_more is True
    rest = await store.search_sessions(limit=2, after=first.items[-1].id)
    assert rest.has_more is False
    assert {s.id for s in [*first.items, *rest.items]} == {"a1", "a2", "d1"}
    with pytest.raises(SessionNotFound):
        await store.search_sessions(after="nobody")


async def test_a_missed_request_is_an_advisory_of_kind_none(store: SqlSessionStore) -> None:
    await store.create_session(session_id="s")
    advisory = await store.create_advisory(
        "s", tenant_id="default", kind="none", target_worker=None, created_at=T0, expires_at=T0
    )
    resolved = await store.resolve_advisory(advisory.id, outcome="missed", resolved_at=T0)
    assert (resolved.kind, resolved.outcome) == ("none", "missed")
