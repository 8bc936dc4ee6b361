"""The session store as its callers see it, on SQLite and on PostgreSQL (the `store` fixture runs both)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event, text

from sessiongate.sessions import (
    AdvisoryNotFound,
    InvalidTransition,
    SessionExists,
    SessionNotFound,
    SessionRecord,
    SqlSessionStore,
    ToolCallNotFound,
    TurnNotFound,
    TurnRecord,
)

pytestmark = pytest.mark.anyio

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str | None, *calls: tuple[str, str, str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls
        ]
    return message


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


async def chat(
    store: SqlSessionStore,
    session_id: str,
    messages: list[dict[str, Any]],
    reply: dict[str, Any],
    *,
    start: float,
    tenant_id: str = "default",
) -> TurnRecord:
    """One successful request: begin, dispatch, complete (the answer ends 1 s after the request)."""
    turn = await store.begin_turn(
        session_id, tenant_id=tenant_id, messages=messages, request={"model": "m"}, received_at=at(start)
    )
    await store.mark_dispatched(turn.id, worker="w1", dispatched_at=at(start + 0.01))
    await store.complete_turn(turn.id, output_message=reply, finish_reason="stop", model="m", ended_at=at(start + 1))
    return await read_back(store, turn, tenant_id=tenant_id)


async def read_back(store: SqlSessionStore, turn: TurnRecord, *, tenant_id: str = "default") -> TurnRecord:
    """`turn` as stored now (a turn's end returns nothing)."""
    [stored] = await store.list_turns(turn.session_id, tenant_id=tenant_id, after_seq=turn.seq - 1, limit=1)
    return stored


# sessions


async def test_create_and_get_session(store: SqlSessionStore) -> None:
    created = await store.create_session(priority=2, metadata={"app": "chat"})
    assert created.id.startswith("sess_")
    assert len(created.id) == 5 + 24
    assert created.tenant_id == "default"
    assert (created.state, created.priority, created.metadata, created.turn_count) == ("active", 2, {"app": "chat"}, 0)
    assert created.created_at.tzinfo is UTC
    assert await store.get_session(created.id, tenant_id="default") == created

    mine = await store.create_session(tenant_id="acme", session_id="client-chosen:1")
    assert (mine.id, mine.tenant_id) == ("client-chosen:1", "acme")
    with pytest.raises(SessionExists):
        await store.create_session(tenant_id="acme", session_id="client-chosen:1")
    with pytest.raises(SessionExists):
        await store.create_session(tenant_id="other", session_id="client-chosen:1")
    with pytest.raises(SessionNotFound):
        await store.get_session("nope", tenant_id="default")
    with pytest.raises(ValueError, match="128"):
        await store.create_session(session_id="x" * 129)


async def test_other_tenants_cannot_see_a_session(store: SqlSessionStore) -> None:
    session = await store.create_session(tenant_id="a", session_id="shared-name")
    turn = await chat(store, session.id, [user("q")], answer(None, ("c1", "f", "{}")), start=0, tenant_id="a")
    attempts = [
        store.get_session(session.id, tenant_id="b"),
        store.update_session(session.id, tenant_id="b", priority=5),
        store.delete_session(session.id, tenant_id="b"),
        store.session_context(session.id, tenant_id="b"),
        store.list_turns(session.id, tenant_id="b"),
        store.begin_turn(session.id, tenant_id="b", messages=[user("q")], request={}, received_at=at(5)),
        store.record_tool_result(session.id, "c1", tenant_id="b", content="r", returned_at=at(5)),
        store.pending_tool_calls(session.id, tenant_id="b"),
        store.list_advisories(session.id, tenant_id="b"),
    ]
    for attempt in attempts:
        with pytest.raises(SessionNotFound):
            await attempt
    with pytest.raises(SessionExists):
        await store.get_or_create_session(session.id, tenant_id="b")
    assert (await store.list_sessions(tenant_id="b")).items == []
    # Nothing changed for the owner.
    assert (await store.get_session(session.id, tenant_id="a")).turn_count == 1
    assert [t.id for t in await store.list_turns(session.id, tenant_id="a")] == [turn.id]


async def test_list_sessions_pages_newest_first(store: SqlSessionStore) -> None:
    created = [await store.create_session(tenant_id="t") for _ in range(5)]
    await store.create_session(tenant_id="someone-else")
    expected = sorted(sorted(created, key=lambda s: s.id), key=lambda s: s.created_at, reverse=True)

    seen: list[SessionRecord] = []
    after: str | None = None
    pages = 0
    while True:
        page = await store.list_sessions(tenant_id="t", limit=2, after=after)
        pages += 1
        seen.extend(page.items)
        if not page.has_more:
            break
        after = page.items[-1].id
    assert [s.id for s in seen] == [s.id for s in expected]
    assert pages == 3

    await store.update_session(expected[0].id, tenant_id="t", state="closed")
    closed = await store.list_sessions(tenant_id="t", state="closed")
    assert [s.id for s in closed.items] == [expected[0].id]
    assert not closed.has_more
    assert len((await store.list_sessions(tenant_id="t", state="active")).items) == 4
    with pytest.raises(SessionNotFound):
        await store.list_sessions(tenant_id="t", after="deleted-or-unknown")


async def test_list_sessions_pages_through_equal_creation_times_by_id(store: SqlSessionStore) -> None:
    frozen = SqlSessionStore(store.engine, clock=lambda: T0)  # shares the engine: the fixture closes it
    ids = sorted([(await frozen.create_session(tenant_id="t")).id for _ in range(5)])
    first = await store.list_sessions(tenant_id="t", limit=3)
    rest = await store.list_sessions(tenant_id="t", limit=3, after=first.items[-1].id)
    assert [s.id for s in [*first.items, *rest.items]] == ids
    assert (first.has_more, rest.has_more) == (True, False)


async def test_update_session(store: SqlSessionStore) -> None:
    session = await store.create_session(metadata={"a": 1})
    updated = await store.update_session(session.id, tenant_id="default", priority=7, metadata={"b": 2})
    assert (updated.priority, updated.metadata, updated.state) == (7, {"b": 2}, "active")
    closed = await store.update_session(session.id, tenant_id="default", state="closed")
    assert (closed.priority, closed.metadata, closed.state) == (7, {"b": 2}, "closed")
    assert await store.update_session(session.id, tenant_id="default") == closed
    assert await store.get_session(session.id, tenant_id="default") == closed
    with pytest.raises(ValueError, match="state"):
        await store.update_session(session.id, tenant_id="default", state="sleeping")
    with pytest.raises(SessionNotFound):
        await store.update_session("nope", tenant_id="default", priority=1)


async def test_delete_session_removes_everything_it_owns(store: SqlSessionStore) -> None:
    session = await store.create_session(session_id="doomed")
    await chat(store, "doomed", [user("q")], answer(None, ("c1", "f", "{}")), start=0)
    await store.create_advisory(
        "doomed", tenant_id="default", kind="tool_call", target_worker="w1", created_at=at(1), expires_at=at(9)
    )
    await store.delete_session(session.id, tenant_id="default")

    with pytest.raises(SessionNotFound):
        await store.get_session("doomed", tenant_id="default")
    with pytest.raises(SessionNotFound):
        await store.delete_session("doomed", tenant_id="default")
    async with store.engine.connect() as connection:
        for table in ("turns", "tool_calls", "advisories"):
            count = await connection.scalar(text(f"SELECT count(*) FROM {table} WHERE session_id = 'doomed'"))
            assert count == 0, table
    # A new session under the same id starts empty.
    await store.create_session(session_id="doomed")
    assert await store.list_turns("doomed", tenant_id="default") == []
    assert await store.pending_tool_calls("doomed", tenant_id="default") == []
    assert await store.list_advisories("doomed", tenant_id="default") == []
    assert await store.session_context("doomed", tenant_id="default") == []


async def test_concurrent_get_or_create_agrees_on_one_session(store: SqlSessionStore) -> None:
    results = await asyncio.gather(*(store.get_or_create_session("racy", tenant_id="t") for _ in range(10)))
    assert sum(created for _, created in results) == 1
    assert all(record == results[0][0] for record, _ in results)
    assert [s.id for s in (await store.list_sessions(tenant_id="t")).items] == ["racy"]
    again, created = await store.get_or_create_session("racy", tenant_id="t")
    assert not created
    assert again == results[0][0]


# turns and history


async def test_turns_store_only_what_is_new(store: SqlSessionStore) -> None:
    session = await store.create_session()
    system: dict[str, Any] = {"role": "system", "content": "be brief"}
    reply = {**answer("a1"), "reasoning_content": "x"}
    first = await chat(store, session.id, [system, user("q1")], reply, start=0)
    assert (first.seq, first.status, first.context_reset) == (1, "ok", False)
    assert first.input_messages == [system, user("q1")]

    # The client echoes the answer without the extra key and the question as content parts.
    echoed: list[dict[str, Any]] = [
        system,
        {"role": "user", "content": [{"type": "text", "text": "q1"}]},
        answer("a1"),
    ]
    second = await store.begin_turn(
        session.id, tenant_id="default", messages=[*echoed, user("q2")], request={"stream": True}, received_at=at(5)
    )
    assert (second.seq, second.status, second.context_reset) == (2, "pending", False)
    assert second.input_messages == [user("q2")]
    assert second.request == {"stream": True}

    current = await store.get_session(session.id, tenant_id="default")
    assert current.turn_count == 2
    assert current.last_active_at == at(5)
    # A pending turn is not context yet.
    assert await store.session_context(session.id, tenant_id="default") == [system, user("q1"), reply]


async def test_edited_history_resets_the_context(store: SqlSessionStore) -> None:
    session = await store.create_session()
    await chat(store, session.id, [user("q1")], answer("a1"), start=0)
    await chat(store, session.id, [user("q1"), answer("a1"), user("q2")], answer("a2"), start=2)

    edited = [user("q1, rephrased"), answer("a1"), user("q2")]
    turn = await chat(store, session.id, edited, answer("a2'"), start=4)
    assert turn.context_reset
    assert turn.input_messages == edited
    assert await store.session_context(session.id, tenant_id="default") == [*edited, answer("a2'")]

    # After the reset, deltas are computed against the new context.
    nxt = await chat(store, session.id, [*edited, answer("a2'"), user("q3")], answer("a3"), start=6)
    assert (nxt.context_reset, nxt.input_messages) == (False, [user("q3")])


async def test_a_failed_turn_is_kept_but_not_context_and_its_retry_is_recorded_again(
    store: SqlSessionStore,
) -> None:
    session = await store.create_session()
    await chat(store, session.id, [user("q1")], answer("a1"), start=0)
    messages = [user("q1"), answer("a1"), user("q2")]

    doomed = await store.begin_turn(session.id, tenant_id="default", messages=messages, request={}, received_at=at(2))
    await store.fail_turn(
        doomed.id,
        error_type="upstream_error",
        error_message="worker went away",
        ended_at=at(3),
        partial_output={"role": "assistant", "content": "half an ans"},
        first_token_at=at(2.5),
        worker="w2",
        dispatched_at=at(2.1),
    )
    failed = await read_back(store, doomed)
    assert failed.status == "failed"
    assert failed.error == {"type": "upstream_error", "message": "worker went away"}
    assert failed.output_message == {"role": "assistant", "content": "half an ans"}
    assert (failed.worker, failed.dispatched_at, failed.first_token_at, failed.ended_at) == (
        "w2",
        at(2.1),
        at(2.5),
        at(3),
    )
    assert await store.session_context(session.id, tenant_id="default") == [user("q1"), answer("a1")]

    retry = await chat(store, session.id, messages, answer("a2"), start=4)
    assert (retry.input_messages, retry.context_reset) == ([user("q2")], False)

    cancelled = await store.begin_turn(
        session.id, tenant_id="default", messages=[*messages, answer("a2"), user("q3")], request={}, received_at=at(6)
    )
    await store.fail_turn(
        cancelled.id, status="cancelled", error_type="client_disconnected", error_message="", ended_at=at(7)
    )
    turns = await store.list_turns(session.id, tenant_id="default")
    assert [(t.seq, t.status) for t in turns] == [(1, "ok"), (2, "failed"), (3, "ok"), (4, "cancelled")]
    assert turns[1].input_messages == turns[2].input_messages == [user("q2")]
    assert [t.seq for t in await store.list_turns(session.id, tenant_id="default", limit=2, after_seq=1)] == [2, 3]
    with pytest.raises(ValueError, match="status"):
        await store.fail_turn(retry.id, status="ok", error_type="x", error_message="x", ended_at=at(9))


async def test_complete_turn_records_usage_and_requested_tool_calls(store: SqlSessionStore) -> None:
    session = await store.create_session()
    turn = await store.begin_turn(session.id, tenant_id="default", messages=[user("q")], request={}, received_at=at(0))
    await store.mark_dispatched(turn.id, worker="w1", dispatched_at=at(0.1))
    reply = answer(None, ("c1", "search", '{"q": "a"}'), ("c2", "fetch", '{"url": "u"}'))
    await store.complete_turn(
        turn.id,
        output_message=reply,
        finish_reason="tool_calls",
        model="qwen",
        usage={"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 64}},
        cached_tokens_details={"device": 60, "host": 4, "storage": 0},
        first_token_at=at(0.5),
        ended_at=at(2),
    )
    done = await read_back(store, turn)
    assert (done.status, done.finish_reason, done.model, done.worker) == ("ok", "tool_calls", "qwen", "w1")
    assert (done.dispatched_at, done.first_token_at, done.ended_at) == (at(0.1), at(0.5), at(2))
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens) == (100, 20, 64)
    assert done.cached_tokens_details == {"device": 60, "host": 4, "storage": 0}
    assert (done.cached_device, done.cached_host, done.cached_storage) == (60, 4, 0)
    assert [(c.call_id, c.name, c.arguments, c.requested_at, c.result) for c in done.tool_calls] == [
        ("c1", "search", '{"q": "a"}', at(2), None),
        ("c2", "fetch", '{"url": "u"}', at(2), None),
    ]
    assert [c.call_id for c in await store.pending_tool_calls(session.id, tenant_id="default")] == ["c1", "c2"]

    with pytest.raises(InvalidTransition):
        await store.complete_turn(turn.id, output_message=answer("x"), finish_reason="stop", model="m", ended_at=at(3))
    with pytest.raises(InvalidTransition):
        await store.fail_turn(turn.id, error_type="x", error_message="x", ended_at=at(3))
    with pytest.raises(InvalidTransition):
        await store.mark_dispatched(turn.id, worker="w2", dispatched_at=at(3))
    with pytest.raises(TurnNotFound):
        await store.complete_turn(
            "turn_nope", output_message=answer("x"), finish_reason="stop", model="m", ended_at=at(3)
        )


async def test_dispatch_can_be_recorded_with_the_answer(store: SqlSessionStore) -> None:
    session = await store.create_session()
    turn = await store.begin_turn(session.id, tenant_id="default", messages=[user("q")], request={}, received_at=at(0))
    await store.complete_turn(
        turn.id,
        output_message=answer("a"),
        finish_reason="stop",
        model="m",
        ended_at=at(1),
        worker="w3",
        dispatched_at=at(0.2),
    )
    done = await read_back(store, turn)
    assert (done.worker, done.dispatched_at, done.prompt_tokens, done.tool_calls) == ("w3", at(0.2), None, ())


async def test_tool_messages_in_the_next_request_return_the_calls(store: SqlSessionStore) -> None:
    session = await store.create_session()
    reply = answer(None, ("c1", "search", "{}"), ("c2", "fetch", "{}"))
    await chat(store, session.id, [user("q")], reply, start=0)  # calls requested at 1 s

    messages = [
        user("q"),
        reply,
        tool("c1", "found it"),
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "page"}]},
    ]
    turn = await store.begin_turn(session.id, tenant_id="default", messages=messages, request={}, received_at=at(3.5))
    assert turn.input_messages == messages[2:]
    assert await store.pending_tool_calls(session.id, tenant_id="default") == []
    [first, _] = await store.list_turns(session.id, tenant_id="default")
    returned = {c.call_id: c for c in first.tool_calls}
    assert returned["c1"].result == "found it"
    assert returned["c2"].result == "page"
    for call in returned.values():
        assert (call.returned_at, call.duration_ms, call.result_source) == (at(3.5), 2500.0, "message")


async def test_tool_results_posted_through_the_api(store: SqlSessionStore) -> None:
    session = await store.create_session()
    reply = answer(None, ("c1", "search", "{}"))
    await chat(store, session.id, [user("q")], reply, start=0)

    posted = await store.record_tool_result(session.id, "c1", tenant_id="default", content="42", returned_at=at(1.25))
    assert (posted.result, posted.returned_at, posted.duration_ms, posted.result_source) == (
        "42",
        at(1.25),
        250.0,
        "api",
    )
    again = await store.record_tool_result(session.id, "c1", tenant_id="default", content="42", returned_at=at(9))
    assert again == posted
    with pytest.raises(InvalidTransition):
        await store.record_tool_result(session.id, "c1", tenant_id="default", content="43", returned_at=at(9))
    with pytest.raises(ToolCallNotFound):
        await store.record_tool_result(session.id, "c9", tenant_id="default", content="x", returned_at=at(9))

    # The same result arriving later as a role=tool message does not overwrite the API's record.
    await store.begin_turn(
        session.id, tenant_id="default", messages=[user("q"), reply, tool("c1", "42")], request={}, received_at=at(5)
    )
    [first, _] = await store.list_turns(session.id, tenant_id="default")
    assert first.tool_calls == (posted,)


async def test_concurrent_requests_get_distinct_seqs(store: SqlSessionStore) -> None:
    session = await store.create_session()
    turns = await asyncio.gather(
        *(
            store.begin_turn(session.id, tenant_id="default", messages=[user(f"q{i}")], request={}, received_at=at(i))
            for i in range(6)
        )
    )
    assert sorted(t.seq for t in turns) == [1, 2, 3, 4, 5, 6]
    assert (await store.get_session(session.id, tenant_id="default")).turn_count == 6


async def test_a_closed_session_takes_no_new_turns(store: SqlSessionStore) -> None:
    session = await store.create_session()
    await store.update_session(session.id, tenant_id="default", state="closed")
    with pytest.raises(InvalidTransition, match="closed"):
        await store.begin_turn(session.id, tenant_id="default", messages=[user("q")], request={}, received_at=at(0))
    with pytest.raises(SessionNotFound):
        await store.begin_turn("nope", tenant_id="default", messages=[user("q")], request={}, received_at=at(0))


async def test_fail_pending_turns_after_a_crash(store: SqlSessionStore) -> None:
    session = await store.create_session()
    old = await store.begin_turn(session.id, tenant_id="default", messages=[user("q1")], request={}, received_at=at(0))
    new = await store.begin_turn(session.id, tenant_id="default", messages=[user("q2")], request={}, received_at=at(60))
    done = await chat(store, session.id, [user("q3")], answer("a3"), start=61)

    assert await store.fail_pending_turns(older_than=at(30), error_message="gateway restarted") == 1
    assert await store.fail_pending_turns(error_message="gateway restarted") == 1
    assert await store.fail_pending_turns(error_message="gateway restarted") == 0
    by_id = {t.id: t for t in await store.list_turns(session.id, tenant_id="default")}
    for turn in (old, new):
        assert by_id[turn.id].status == "failed"
        assert by_id[turn.id].error == {"type": "interrupted", "message": "gateway restarted"}
        assert by_id[turn.id].ended_at is not None
    assert by_id[done.id].status == "ok"


async def test_fail_pending_turns_looks_up_the_pending_turns_index(store: SqlSessionStore) -> None:
    """The pending turns have a partial index of their own (revision 0003): finding them does not scan every turn
    ever served."""
    if store.engine.dialect.name != "sqlite":
        pytest.skip("the query plan is SQLite's; PostgreSQL plans by its statistics")
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith("UPDATE TURNS"):
            sent.append((statement, parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", record)
    try:
        await store.fail_pending_turns(older_than=at(30), error_message="gateway restarted")
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", record)
    ((statement, parameters),) = sent
    async with store.engine.connect() as conn:
        plan = (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)).all()
    assert any("USING INDEX ix_turns_pending_received_at" in row[-1] for row in plan), plan


async def test_timestamps_come_back_as_the_same_instant_in_utc(store: SqlSessionStore) -> None:
    session = await store.create_session()
    plus_two = datetime(2025, 6, 1, 14, 30, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    turn = await store.begin_turn(
        session.id, tenant_id="default", messages=[user("q")], request={}, received_at=plus_two
    )
    assert turn.received_at == plus_two
    [listed] = await store.list_turns(session.id, tenant_id="default")
    assert listed.received_at == plus_two
    assert listed.received_at.tzinfo is UTC
    assert listed.received_at.hour == 12
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.begin_turn(
            session.id, tenant_id="default", messages=[], request={}, received_at=datetime(2025, 1, 1)
        )


# advisories, workers, health


async def test_advisories(store: SqlSessionStore) -> None:
    session = await store.create_session()
    turn = await chat(store, session.id, [user("q")], answer("a"), start=0)
    typing = await store.create_advisory(
        session.id,
        tenant_id="default",
        kind="typing",
        target_worker="w2",
        created_at=at(2),
        expires_at=at(12),
        detail={"chars": 12},
    )
    assert (typing.id[:4], typing.outcome, typing.resolved_at, typing.detail) == (
        "adv_",
        "pending",
        None,
        {"chars": 12},
    )
    explicit = await store.create_advisory(
        session.id, tenant_id="default", kind="explicit", target_worker=None, created_at=at(3), expires_at=at(4)
    )
    used = await store.resolve_advisory(typing.id, outcome="used", resolved_at=at(5), turn_id=turn.id)
    assert (used.outcome, used.resolved_at, used.turn_id) == ("used", at(5), turn.id)
    with pytest.raises(InvalidTransition):
        await store.resolve_advisory(typing.id, outcome="wasted", resolved_at=at(6))
    with pytest.raises(AdvisoryNotFound):
        await store.resolve_advisory("adv_nope", outcome="wasted", resolved_at=at(6))
    with pytest.raises(ValueError, match="outcome"):
        await store.resolve_advisory(explicit.id, outcome="pending", resolved_at=at(6))
    with pytest.raises(ValueError, match="kind"):
        await store.create_advisory(
            session.id, tenant_id="default", kind="psychic", target_worker=None, created_at=at(3), expires_at=at(4)
        )

    assert await store.list_advisories(session.id, tenant_id="default") == [used, explicit]
    assert await store.list_advisories(session.id, tenant_id="default", outcome="pending") == [explicit]


async def test_workers(store: SqlSessionStore) -> None:
    first = await store.upsert_worker(
        "w2", url="http://b:30000", state="healthy", last_seen_at=at(0), info={"gpu": "H100"}
    )
    await store.upsert_worker("w1", url="http://a:30000", state="healthy", last_seen_at=at(0))
    moved = await store.upsert_worker("w2", url="http://b:30001", state="draining", last_seen_at=at(5))
    assert (moved.url, moved.state, moved.last_seen_at, moved.info) == ("http://b:30001", "draining", at(5), first.info)
    replaced = await store.upsert_worker("w2", url="http://b:30001", state="draining", last_seen_at=at(6), info={})
    assert replaced.info == {}
    assert [w.id for w in await store.list_workers()] == ["w1", "w2"]
    assert [w.id for w in await store.list_workers(state="draining")] == ["w2"]
    with pytest.raises(ValueError, match="state"):
        await store.upsert_worker("w3", url="http://c", state="on fire", last_seen_at=at(0))


async def test_ping(store: SqlSessionStore) -> None:
    await store.ping()
