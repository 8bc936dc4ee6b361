"""The session's context as `begin_turn` sees it through the digest on the session row, and sessions created by a
first turn. Every decision must match what `history.split_delta` makes against `session_context()`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import URL

from sessiongate.sessions import (
    InvalidTransition,
    SessionExists,
    SessionNotFound,
    SqlSessionStore,
    TurnRecord,
    create_engine,
    history,
)
from sessiongate.sessions.history import split_delta
from sessiongate.sessions.turn_write import raw
from sessiongate.sessions.turn_write import statements as sql
from sessiongate.sessions.turn_write.memory import RememberedContext, StoreMemory

pytestmark = pytest.mark.anyio

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str | None, *call_ids: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if call_ids:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": "grep", "arguments": '{"q": 1}'}}
            for call_id in call_ids
        ]
    return message


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


async def begin(
    store: SqlSessionStore, session_id: str, messages: list[dict[str, Any]], start: float, **options: Any
) -> TurnRecord:
    return await store.begin_turn(
        session_id, tenant_id="default", messages=messages, request={}, received_at=at(start), **options
    )


async def complete(
    store: SqlSessionStore, turn: TurnRecord, reply: dict[str, Any], end: float, *, tenant_id: str = "default"
) -> TurnRecord:
    """Complete `turn`; its record as stored now (a turn's end returns none)."""
    await store.complete_turn(turn.id, output_message=reply, finish_reason="stop", model="m", ended_at=at(end))
    [ended] = await store.list_turns(turn.session_id, tenant_id=tenant_id, after_seq=turn.seq - 1, limit=1)
    return ended


async def chat(
    store: SqlSessionStore, session_id: str, messages: list[dict[str, Any]], reply: dict[str, Any], start: float
) -> TurnRecord:
    return await complete(store, await begin(store, session_id, messages, start), reply, start + 1)


@contextmanager
def statements(store: SqlSessionStore) -> Iterator[list[str]]:
    """The SQL the store sends while the block runs."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(store.engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", record)


async def test_begin_turn_does_not_read_the_turns_of_a_long_session(store: SqlSessionStore) -> None:
    session = await store.create_session()
    sent: list[dict[str, Any]] = [{"role": "system", "content": "agent"}]
    per_turn: list[list[str]] = []
    for t in range(40):
        tool_turn = t % 2 == 1
        sent.append(tool(f"c{t - 1}", f"result {t}") if tool_turn else user(f"task {t}"))
        with statements(store) as seen:
            turn = await begin(store, session.id, sent, t)
        per_turn.append(seen)
        assert (turn.input_messages, turn.context_reset) == (sent[-2:] if t == 0 else [sent[-1]], False)
        reply = answer(f"done {t}") if tool_turn else answer(None, f"c{t}")
        await complete(store, turn, reply, t + 0.5)
        sent.append(reply)

    for seen in per_turn:
        assert not [sql for sql in seen if sql.startswith("SELECT") and " turns" in sql], seen
    # The work does not grow with the session: the 40th turn sends what the 2nd (a tool result too) did.
    assert len(per_turn[39]) == len(per_turn[1])
    assert [sql for sql in per_turn[38] if sql.startswith("SELECT")] == []  # a user message: writes only
    assert await store.pending_tool_calls(session.id, tenant_id="default") == []


async def test_edited_history_resets_the_context(store: SqlSessionStore) -> None:
    session = await store.create_session()
    await chat(store, session.id, [user("q1")], answer("a1"), 0)
    await chat(store, session.id, [user("q1"), answer("a1"), user("q2")], answer("a2"), 2)

    edited = [user("q1, said differently"), answer("a1"), user("q2"), answer("a2"), user("q3")]
    turn = await begin(store, session.id, edited, 4)
    assert (turn.input_messages, turn.context_reset) == (edited, True)
    await complete(store, turn, answer("a3"), 5)
    assert await store.session_context(session.id, tenant_id="default") == [*edited, answer("a3")]
    # As the reset turn found it (what a prefix break examined after the turn ended compares with):
    before = [user("q1"), answer("a1"), user("q2"), answer("a2")]
    assert await store.session_context(session.id, tenant_id="default", before_seq=turn.seq) == before

    rewound = await begin(store, session.id, [user("q1, said differently")], 6)  # fewer messages than the context
    assert (rewound.input_messages, rewound.context_reset) == ([user("q1, said differently")], True)
    await store.fail_turn(rewound.id, error_type="x", error_message="x", ended_at=at(7))

    # The reset turn's context goes on: the next request that extends it stores only what is new.
    follow_up = await begin(store, session.id, [*edited, answer("a3"), user("q4")], 8)
    assert (follow_up.input_messages, follow_up.context_reset) == ([user("q4")], False)


async def test_resent_history_stores_only_what_is_new(store: SqlSessionStore) -> None:
    session = await store.create_session()
    context = [{"role": "system", "content": "s"}, user("q1"), answer("a1")]
    await chat(store, session.id, context[:2], context[2], 0)

    same = await begin(store, session.id, context, 2)  # the same history again, nothing new
    assert (same.input_messages, same.context_reset) == ([], False)
    await store.fail_turn(same.id, error_type="x", error_message="x", ended_at=at(3))

    # Keys the comparison ignores (and content as parts) do not count as an edit.
    echoed = [
        *context[:2],
        {**context[2], "name": None, "refusal": None},
        {"role": "user", "content": [{"type": "text", "text": "q2"}]},
    ]
    turn = await begin(store, session.id, echoed, 4)
    assert (turn.input_messages, turn.context_reset) == ([echoed[3]], False)


async def test_a_failed_turns_messages_are_recorded_again(store: SqlSessionStore) -> None:
    session = await store.create_session()
    first = await begin(store, session.id, [user("q1")], 0)
    await store.fail_turn(first.id, error_type="upstream", error_message="503", ended_at=at(1))
    retried = await begin(store, session.id, [user("q1")], 2)
    assert (retried.input_messages, retried.context_reset) == ([user("q1")], False)
    await complete(store, retried, answer("a1"), 3)

    messages = [user("q1"), answer("a1"), user("q2")]
    cancelled = await begin(store, session.id, messages, 4)
    await store.fail_turn(cancelled.id, status="cancelled", error_type="gone", error_message="", ended_at=at(5))
    again = await begin(store, session.id, messages, 6)
    assert (again.input_messages, again.context_reset) == ([user("q2")], False)
    assert await store.session_context(session.id, tenant_id="default") == [user("q1"), answer("a1")]


async def test_tool_messages_return_the_calls_late_in_a_session(store: SqlSessionStore) -> None:
    session = await store.create_session()
    messages = [user("q0")]
    for t in range(10):  # a context of 20 messages first
        await chat(store, session.id, messages, answer(f"a{t}"), t * 2)
        messages += [answer(f"a{t}"), user(f"q{t + 1}")]
    asked = await chat(store, session.id, messages, answer(None, "c1", "c2"), 30)
    messages += [answer(None, "c1", "c2"), tool("c1", "r1"), tool("c2", "r2")]

    turn = await begin(store, session.id, messages, 33)
    assert (turn.input_messages, turn.context_reset) == ([tool("c1", "r1"), tool("c2", "r2")], False)
    assert await store.pending_tool_calls(session.id, tenant_id="default") == []
    [listed] = await store.list_turns(session.id, tenant_id="default", after_seq=asked.seq - 1, limit=1)
    assert [(c.call_id, c.result, c.duration_ms, c.result_source) for c in listed.tool_calls] == [
        ("c1", "r1", 2000.0, "message"),
        ("c2", "r2", 2000.0, "message"),
    ]


async def test_turns_that_complete_out_of_order_keep_the_context_in_seq_order(store: SqlSessionStore) -> None:
    session = await store.create_session()
    await chat(store, session.id, [user("q1")], answer("a1"), 0)
    base = [user("q1"), answer("a1")]
    second = await begin(store, session.id, [*base, user("q2")], 2)
    third = await begin(store, session.id, [*base, user("q3")], 3)
    reset = await begin(store, session.id, [user("other")], 4)
    fifth = await begin(store, session.id, [*base, user("q5")], 5)

    await complete(store, third, answer("a3"), 6)
    await complete(store, second, answer("a2"), 7)  # completes after a later turn
    context = await store.session_context(session.id, tenant_id="default")
    assert context == [*base, user("q2"), answer("a2"), user("q3"), answer("a3")]
    turn = await begin(store, session.id, [*context, user("q6")], 8)
    assert (turn.input_messages, turn.context_reset) == ([user("q6")], False)
    await store.fail_turn(turn.id, error_type="x", error_message="x", ended_at=at(9))

    await complete(store, fifth, answer("a5"), 10)
    await complete(store, reset, answer("b"), 11)  # a reset completing late moves the context's start
    context = await store.session_context(session.id, tenant_id="default")
    assert context == [user("other"), answer("b"), user("q5"), answer("a5")]
    turn = await begin(store, session.id, [*context, user("q7")], 12)
    assert (turn.input_messages, turn.context_reset) == ([user("q7")], False)


async def test_the_digest_decides_as_split_delta_on_the_context(store: SqlSessionStore) -> None:
    """Random interleavings of requests (extending the context, or not) and their outcomes."""
    rng = random.Random(20251122)
    session = await store.create_session()
    pending: list[tuple[TurnRecord, list[dict[str, Any]]]] = []
    for step in range(80):
        if pending and (len(pending) > 3 or rng.random() < 0.5):
            turn, _ = pending.pop(rng.randrange(len(pending)))
            if rng.random() < 0.75:
                await complete(store, turn, answer(f"a{step}", *([f"c{step}"] if rng.random() < 0.3 else [])), step)
            else:
                await store.fail_turn(turn.id, error_type="x", error_message="x", ended_at=at(step))
            continue
        context = await store.session_context(session.id, tenant_id="default")
        choice = rng.random()
        if choice < 0.6 or not context:
            messages = [*context, user(f"q{step}")]
        elif choice < 0.75:
            messages = list(context)  # nothing new
        elif choice < 0.9:
            cut = rng.randrange(len(context))
            messages = [*context[:cut], user(f"edited {step}"), *context[cut + 1 :]]
        else:
            messages = [*context[: rng.randrange(len(context))], user(f"rewound {step}")]
        turn = await begin(store, session.id, messages, step)
        expected = split_delta(context, messages)
        assert (turn.input_messages, turn.context_reset) == (expected.input_messages, expected.context_reset), step
        pending.append((turn, messages))


# sessions created by their first turn


async def test_begin_turn_can_create_the_session(store: SqlSessionStore) -> None:
    first = await store.begin_turn(
        "new-1", tenant_id="acme", messages=[user("q")], request={}, received_at=at(0), create_session=True
    )
    assert (first.session_id, first.seq, first.input_messages, first.context_reset) == ("new-1", 1, [user("q")], False)
    session = await store.get_session("new-1", tenant_id="acme")
    assert (session.state, session.turn_count, session.priority, session.metadata) == ("active", 1, 0, {})
    assert session.last_active_at >= at(0)
    await complete(store, first, answer("a"), 1, tenant_id="acme")

    second = await store.begin_turn(
        "new-1",
        tenant_id="acme",
        messages=[user("q"), answer("a"), user("q2")],
        request={},
        received_at=at(2),
        create_session=True,
    )
    assert (second.seq, second.input_messages) == (2, [user("q2")])
    assert (await store.get_session("new-1", tenant_id="acme")).turn_count == 2

    with pytest.raises(SessionExists):  # as get_or_create_session: the id is another tenant's
        await store.begin_turn(
            "new-1", tenant_id="other", messages=[user("q")], request={}, received_at=at(3), create_session=True
        )
    with pytest.raises(SessionNotFound):
        await store.begin_turn("new-1", tenant_id="other", messages=[user("q")], request={}, received_at=at(3))
    with pytest.raises(SessionNotFound):
        await store.begin_turn("new-2", tenant_id="acme", messages=[user("q")], request={}, received_at=at(3))
    await store.update_session("new-1", tenant_id="acme", state="closed")
    with pytest.raises(InvalidTransition, match="closed"):
        await store.begin_turn(
            "new-1", tenant_id="acme", messages=[user("q")], request={}, received_at=at(4), create_session=True
        )
    with pytest.raises(ValueError, match="128"):
        await store.begin_turn(
            "x" * 129, tenant_id="acme", messages=[], request={}, received_at=at(4), create_session=True
        )
    assert (await store.get_session("new-1", tenant_id="acme")).turn_count == 2
    assert (await store.list_sessions(tenant_id="other")).items == []


async def test_concurrent_first_turns_create_one_session(store: SqlSessionStore) -> None:
    turns = await asyncio.gather(
        *(
            store.begin_turn(
                "racy", tenant_id="t", messages=[user(f"q{i}")], request={}, received_at=at(i), create_session=True
            )
            for i in range(8)
        )
    )
    assert sorted(t.seq for t in turns) == list(range(1, 9))
    assert [s.id for s in (await store.list_sessions(tenant_id="t")).items] == ["racy"]
    assert (await store.get_session("racy", tenant_id="t")).turn_count == 8


# completing a turn this store began (memory.StoreMemory) or one it did not


async def test_a_turn_completed_by_the_store_that_began_it_keeps_its_dispatch(store: SqlSessionStore) -> None:
    session = await store.create_session()
    first = await begin(store, session.id, [user("q1")], 0)
    await store.mark_dispatched(first.id, worker="w-marked", dispatched_at=at(0.5))
    reply = answer("a1", "call-1")
    await store.complete_turn(
        first.id,
        output_message=reply,
        finish_reason="tool_calls",
        model="m",
        usage={"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}},
        cached_tokens_details={"device": 4, "host": 0, "storage": 0},
        first_token_at=at(0.7),
        ended_at=at(1),
    )
    (done,) = await store.list_turns(session.id, tenant_id="default")
    assert (done.status, done.output_message, done.finish_reason) == ("ok", reply, "tool_calls")
    assert (done.worker, done.dispatched_at) == ("w-marked", at(0.5))  # kept from mark_dispatched
    assert (done.first_token_at, done.ended_at) == (at(0.7), at(1))
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens, done.cached_device) == (10, 2, 4, 4)
    assert [call.call_id for call in done.tool_calls] == ["call-1"]
    turn = await begin(store, session.id, [user("q1"), reply, tool("call-1", "found")], 2)
    assert (turn.input_messages, turn.context_reset) == ([tool("call-1", "found")], False)


@pytest.mark.parametrize("end_names_worker", [False, True], ids=["end-without-worker", "end-with-worker"])
async def test_a_turn_begun_by_another_store_completes_on_the_general_path(
    store: SqlSessionStore, database_url: URL, end_names_worker: bool
) -> None:
    other = SqlSessionStore(create_engine(database_url))
    try:
        session = await store.create_session()
        await chat(store, session.id, [user("q1")], answer("a1"), 0)
        base = [user("q1"), answer("a1")]
        turn = await begin(store, session.id, [*base, user("q2")], 2)
        done = await complete(other, turn, answer("a2"), 3)  # `other` never saw it begin
        assert (done.status, done.input_messages, done.output_message) == ("ok", [user("q2")], answer("a2"))
        context = await store.session_context(session.id, tenant_id="default")
        assert context == [*base, user("q2"), answer("a2")]
        # The store that began it still knows it, and learns it ended, whether or not its own end names the worker
        # and the dispatch time (without them, the statement keeps the row's).
        worker = {"worker": "w1", "dispatched_at": at(3.5)} if end_names_worker else {}
        with pytest.raises(InvalidTransition):
            await store.complete_turn(
                turn.id, output_message=answer("again"), finish_reason="stop", model="m", ended_at=at(4), **worker
            )
        nxt = await begin(store, session.id, [*context, user("q3")], 5)
        assert (nxt.input_messages, nxt.context_reset) == ([user("q3")], False)
    finally:
        await other.close()


# claiming a turn's seq from what this store's own writes left on the session row (memory.StoreMemory)


@contextmanager
def remembered_claims(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """For every claim of a seq from the remembered row (`CLAIM_KNOWN_SEQ`): the rows it changed (0: the row was
    no longer as remembered)."""
    changed: list[int] = []
    count = raw.count

    def spy(conn: Any, statement: Any, params: Any) -> int:
        rows = count(conn, statement, params)
        if statement is sql.CLAIM_KNOWN_SEQ:
            changed.append(rows)
        return rows

    with monkeypatch.context() as patch:
        patch.setattr(raw, "count", spy)
        yield changed


async def test_a_session_this_store_last_wrote_claims_its_seq_from_memory(
    store: SqlSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await store.create_session(priority=3)
    with remembered_claims(monkeypatch) as claims:
        first = await chat(store, session.id, [user("q1")], answer("a1"), 0)
        assert claims == []  # the row was written by create_session: read back
        second = await begin(store, session.id, [user("q1"), answer("a1"), user("q2")], 2)
        assert claims == [1]
    assert (first.seq, second.seq, second.session_priority) == (1, 2, 3)
    assert (second.input_messages, second.context_reset) == ([user("q2")], False)
    assert (await store.get_session(session.id, tenant_id="default")).turn_count == 2


@pytest.mark.parametrize("change", ["priority", "turn-on-another-store", "context-on-another-store", "closed"])
async def test_a_session_row_changed_by_another_writer_is_read_back(
    store: SqlSessionStore, database_url: URL, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    other = SqlSessionStore(create_engine(database_url))
    try:
        session = await store.create_session()
        await chat(store, session.id, [user("q1")], answer("a1"), 0)
        sent = [user("q1"), answer("a1")]
        if change == "priority":
            await other.update_session(session.id, tenant_id="default", priority=7)
        elif change == "turn-on-another-store":
            await other.begin_turn(session.id, tenant_id="default", messages=[user("x")], request={}, received_at=at(1))
        elif change == "context-on-another-store":
            await chat(other, session.id, [*sent, user("q2")], answer("a2"), 1)
            sent += [user("q2"), answer("a2")]
        else:
            await other.update_session(session.id, tenant_id="default", state="closed")
        with remembered_claims(monkeypatch) as claims:
            if change == "closed":
                with pytest.raises(InvalidTransition):
                    await begin(store, session.id, [*sent, user("q3")], 3)
            else:
                turn = await begin(store, session.id, [*sent, user("q3")], 3)
            assert claims == [0]  # remembered, found changed, read back
        if change == "closed":
            return
        expected = {"priority": (2, 7), "turn-on-another-store": (3, 0), "context-on-another-store": (3, 0)}[change]
        assert (turn.seq, turn.session_priority) == expected
        assert (turn.input_messages, turn.context_reset) == ([user("q3")], False)
        # and the store remembers the row as read: the next turn claims from memory again
        await complete(store, turn, answer("a3"), 4)
        with remembered_claims(monkeypatch) as claims:
            nxt = await begin(store, session.id, [*sent, user("q3"), answer("a3"), user("q4")], 5)
            assert claims == [1]
        assert (nxt.seq, nxt.input_messages) == (expected[0] + 1, [user("q4")])
    finally:
        await other.close()


# comparing a request with the remembered context's messages instead of hashing them (memory.StoreMemory)


@contextmanager
def hashed_messages(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """For every digest computed from normalised messages: how many messages it hashed."""
    hashed: list[int] = []
    extend = history.extend_normalised

    def spy(digest: str, normalised: Any) -> str:
        messages = list(normalised)
        hashed.append(len(messages))
        return extend(digest, messages)

    with monkeypatch.context() as patch:
        patch.setattr(history, "extend_normalised", spy)
        yield hashed


async def test_a_remembered_context_is_compared_not_hashed(
    store: SqlSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await store.create_session()
    messages = [{"role": "system", "content": "agent"}, user("q1")]
    await chat(store, session.id, messages, answer("a1"), 0)
    messages.append(answer("a1"))
    for t in range(1, 6):
        messages.append(user(f"q{t + 1}"))
        with hashed_messages(monkeypatch) as hashed:
            turn = await begin(store, session.id, messages, t * 2)
            reply = answer(f"a{t + 1}")
            await complete(store, turn, reply, t * 2 + 1)
        assert (turn.input_messages, turn.context_reset) == ([user(f"q{t + 1}")], False)
        assert hashed == [1, 1]  # the new message, then the answer: never the resent history
        messages.append(reply)

    # An edit anywhere in the remembered history is still seen (and a message echoed with keys the comparison
    # ignores is not an edit).
    edited = [*messages[:3], {**messages[3], "content": "q2, said differently"}, *messages[4:], user("q7")]
    turn = await begin(store, session.id, edited, 20)
    assert (turn.input_messages, turn.context_reset) == (edited, True)
    await complete(store, turn, answer("a7"), 21)
    echoed = [*edited[:2], {**edited[2], "refusal": None}, *edited[3:], answer("a7"), user("q8")]
    turn = await begin(store, session.id, echoed, 22)
    assert (turn.input_messages, turn.context_reset) == ([user("q8")], False)
    assert await store.session_context(session.id, tenant_id="default") == [*edited, answer("a7")]


async def test_a_context_this_store_does_not_know_is_hashed_then_remembered(
    store: SqlSessionStore, database_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = SqlSessionStore(create_engine(database_url))
    try:
        session = await store.create_session()
        messages = [user("q1")]
        await chat(other, session.id, messages, answer("a1"), 0)  # the context moved on another store
        messages += [answer("a1"), user("q2")]
        with hashed_messages(monkeypatch) as hashed:
            turn = await begin(store, session.id, messages, 2)
        assert (turn.input_messages, turn.context_reset) == ([user("q2")], False)
        assert hashed == [2, 1]  # the resent history, then the new message
        await complete(store, turn, answer("a2"), 3)
        messages += [answer("a2"), user("q3")]
        with hashed_messages(monkeypatch) as hashed:
            turn = await begin(store, session.id, messages, 4)
        assert (turn.input_messages, hashed) == ([user("q3")], [1])
    finally:
        await other.close()


def test_store_memory_keeps_contexts_within_its_character_budget() -> None:
    memory = StoreMemory(max_entries=3, max_context_chars=10)
    digests: dict[str, tuple[str, int]] = {}

    def move(session: str, *texts: str) -> None:
        normalised = [history.normalise_message(user(text)) for text in texts]
        context = RememberedContext(
            history.extend_normalised(history.EMPTY_DIGEST, normalised),
            len(normalised),
            normalised,
            sum(map(history.message_chars, normalised)),
        )
        memory.move_context(session, context)
        digests[session] = (context.digest, context.length)

    def kept() -> list[str]:
        return [s for s, (digest, length) in digests.items() if memory.context(s, digest, length) is not None]

    move("s1", "aaa")
    move("s2", "bbb", "c")
    move("s3", "dd")
    assert (kept(), memory.context_chars) == (["s1", "s2", "s3"], 9)
    move("s1", "aaa", "e")  # s1's context moves on: the old one is released
    assert (kept(), memory.context_chars) == (["s1", "s2", "s3"], 10)
    move("s4", "f")  # 11 characters: the least recently moved (s2) goes
    assert (kept(), memory.context_chars) == (["s1", "s3", "s4"], 7)
    move("s2", "g" * 11)  # larger than the whole budget: not kept
    assert (kept(), memory.context_chars) == (["s1", "s3", "s4"], 7)
    memory.forget_session("s3")
    assert (kept(), memory.context_chars) == (["s1", "s4"], 5)
    move("s5", "h")
    move("s6", "i")  # more sessions than max_entries: the oldest goes
    assert kept() == ["s4", "s5", "s6"]
    # A context is given out only for the digest and length it has.
    digest, length = digests["s5"]
    assert memory.context("s5", digest, length + 1) is None
    assert memory.context("s5", history.context_digest([user("x")]), length) is None
