"""Each listed turn carries the advisory settled against it, read for a whole page in one query (no N+1)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from sessiongate.sessions import MissedTurn, SqlSessionStore, TurnAdvisory

from .test_store import answer, at, chat, user

pytestmark = pytest.mark.anyio


@contextmanager
def counted_statements(store: SqlSessionStore) -> Iterator[list[str]]:
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(store.engine.sync_engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", count)


async def test_turns_show_the_advisory_settled_against_them(store: SqlSessionStore) -> None:
    session = await store.create_session(session_id="adv-turns")
    first = await chat(store, session.id, [user("q1")], answer("a1"), start=0)
    second = await chat(store, session.id, [user("q2")], answer("a2"), start=10)
    third = await chat(store, session.id, [user("q3")], answer("a3"), start=20)
    typing = await store.create_advisory(
        session.id, tenant_id="default", kind="typing", target_worker="w2", created_at=at(8), expires_at=at(38)
    )
    await store.resolve_advisory(typing.id, outcome="used", resolved_at=at(11), turn_id=second.id)
    # Neither a pending advisory nor one settled without a turn (expired, superseded) belongs to a turn.
    await store.create_advisory(
        session.id, tenant_id="default", kind="explicit", target_worker="w1", created_at=at(21), expires_at=at(51)
    )
    expired = await store.create_advisory(
        session.id, tenant_id="default", kind="tool_call", target_worker="w1", created_at=at(12), expires_at=at(13)
    )
    await store.resolve_advisory(expired.id, outcome="wasted", resolved_at=at(13))
    await store.record_missed_turns([MissedTurn(session.id, "default", third.id, at(20))])

    listed = await store.list_turns(session.id, tenant_id="default")

    assert [t.id for t in listed] == [first.id, second.id, third.id]
    assert listed[0].advisory is None
    assert listed[1].advisory == TurnAdvisory(id=typing.id, kind="typing", outcome="used", target_worker="w2")
    missed = listed[2].advisory
    assert missed is not None
    assert (missed.kind, missed.outcome, missed.target_worker) == ("none", "missed", None)


async def test_a_page_of_turns_costs_the_same_statements_whatever_its_length(store: SqlSessionStore) -> None:
    async def statements_for(session_id: str, turns: int) -> int:
        await store.create_session(session_id=session_id)
        for n in range(turns):
            turn = await chat(store, session_id, [user(f"q{n}")], answer(f"a{n}"), start=10 * n)
            await store.record_missed_turns([MissedTurn(session_id, "default", turn.id, at(10 * n))])
        with counted_statements(store) as statements:
            listed = await store.list_turns(session_id, tenant_id="default")
        assert all(t.advisory is not None for t in listed)
        return len(statements)

    assert await statements_for("short", 1) == await statements_for("long", 6)
