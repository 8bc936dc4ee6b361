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
