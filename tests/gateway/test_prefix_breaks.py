"""Prefix breaks through the real gateway: the turn records where the resent history broke the stored context,
`/metrics` counts it by kind, and the admin API lists the sessions that had one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.gateway.conftest import Gateway

pytestmark = pytest.mark.anyio

ADMIN = {"authorization": "Bearer admin"}


async def _chat(gateway: Gateway, session_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    answer = await gateway.client.post(
        "/v1/chat/completions", json={"messages": messages}, headers={"x-session-id": session_id}
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["choices"][0]["message"])


async def test_an_edited_answer_is_recorded_counted_and_listed(make_gateway: Any) -> None:
    async with make_gateway(admin_key="admin") as gateway:
        system = {"role": "system", "content": "You are terse."}
        history = [system, {"role": "user", "content": "one"}]
        answer = await _chat(gateway, "s-edit", history)
        history += [answer, {"role": "user", "content": "two"}]
        answer = await _chat(gateway, "s-edit", history)
        # The client rewrites the first answer and changes its system prompt in a second session.
        edited = [
            *history[:2],
            {**history[2], "content": "rewritten"},
            *history[3:],
            answer,
            {"role": "user", "content": "3"},
        ]
        await _chat(gateway, "s-edit", edited)
        await _chat(gateway, "s-plain", [system, {"role": "user", "content": "hi"}])

        # Examined beside the turn, not in its path: recorded a moment after its answer.
        async def examined() -> list[dict[str, Any]]:
            for _ in range(250):
                turns: list[dict[str, Any]] = (await gateway.client.get("/v1/sessions/s-edit/turns")).json()["data"]
                if turns[2]["prefix_break"] is not None:
                    return turns
                await asyncio.sleep(0.02)
            raise AssertionError("the prefix break was not recorded within 5 s")

        turns = await examined()
        assert [t["prefix_break"] is None for t in turns] == [True, True, False]
        found = turns[2]["prefix_break"]
        assert (found["index"], found["kind"]) == (2, "assistant_edited")
        assert found["tokens_lost"] > 0
        assert turns[2]["context_reset"] is True

        metrics = (await gateway.client.get("/metrics")).text
        assert 'sessiongate_prefix_breaks_total{kind="assistant_edited"} 1.0' in metrics

        listed = (await gateway.client.get("/v1/admin/sessions?min_prefix_breaks=1", headers=ADMIN)).json()["data"]
        assert [s["id"] for s in listed] == ["s-edit"]
        assert listed[0]["prefix_breaks"] == 1


async def test_breaks_are_examined_beside_the_turn_and_past_the_backlog_only_counted(make_gateway: Any) -> None:
    """The answer does not wait for the examination (its store read is held here until the turn has answered), and
    past `max_pending` examinations waiting, a reset is counted as unexamined instead of queued."""
    async with make_gateway() as gateway:
        notes = gateway.state.prefix_breaks
        store = gateway.state.store
        read = store.session_context
        release = asyncio.Event()

        async def held_read(*args: Any, **kwargs: Any) -> Any:
            await release.wait()
            return await read(*args, **kwargs)

        store.session_context = held_read  # type: ignore[method-assign]
        notes.max_pending = 1
        for session in ("s-a", "s-b"):
            await _chat(gateway, session, [{"role": "user", "content": "one"}])
            # A new start in the same session resets its context: answered while the examination's read is held.
            await asyncio.wait_for(_chat(gateway, session, [{"role": "user", "content": "another start"}]), 5)
        assert notes.pending == 1  # s-a's examination waits; s-b's reset found the backlog full
        metrics = (await gateway.client.get("/metrics")).text
        assert "sessiongate_prefix_breaks_unexamined_total 1.0" in metrics

        release.set()
        for _ in range(250):
            if notes.pending == 0:
                break
            await asyncio.sleep(0.02)
        turns = (await gateway.client.get("/v1/sessions/s-a/turns")).json()["data"]
        assert turns[-1]["prefix_break"]["kind"] == "compaction"  # compared with the context before the reset
        turns = (await gateway.client.get("/v1/sessions/s-b/turns")).json()["data"]
        assert turns[-1]["prefix_break"] is None
