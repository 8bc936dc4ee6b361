"""Implicit sessions: chat requests that name no session are attached to the stored conversation they extend, and
the session headers other gateways and agents send name a session as `X-Session-Id` does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.conftest import Gateway

pytestmark = pytest.mark.anyio

SYSTEM = {"role": "system", "content": "You are terse."}


async def _chat(gateway: Gateway, messages: list[dict[str, Any]], **headers: str) -> tuple[str, dict[str, Any]]:
    answer = await gateway.client.post("/v1/chat/completions", json={"messages": messages}, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-session-id"], answer.json()["choices"][0]["message"]


async def _turns(gateway: Gateway, session_id: str) -> list[dict[str, Any]]:
    return list((await gateway.client.get(f"/v1/sessions/{session_id}/turns")).json()["data"])


async def test_a_resent_history_without_a_header_is_the_sessions_next_turn(gateway: Gateway) -> None:
    history = [SYSTEM, {"role": "user", "content": "first question"}]
    first, answer = await _chat(gateway, history)
    history += [answer, {"role": "user", "content": "second question"}]
    second, answer = await _chat(gateway, history)
    history += [answer, {"role": "user", "content": "third question"}]
    third, _ = await _chat(gateway, history)
    assert first == second == third
    turns = await _turns(gateway, first)
    assert [t["session_source"] for t in turns] == ["new", "inferred", "inferred"]
    assert [t["context_reset"] for t in turns] == [False, False, False]
    assert turns[2]["input_messages"] == [{"role": "user", "content": "third question"}]
    # Routed with its KV in mind: the inferred turns go where the session's context is cached.
    assert turns[1]["worker"] == turns[0]["worker"]
    assert turns[1]["usage"]["cached_tokens"] > 0


async def test_first_messages_start_new_sessions(gateway: Gateway) -> None:
    one, _ = await _chat(gateway, [SYSTEM, {"role": "user", "content": "hello"}])
    two, _ = await _chat(gateway, [SYSTEM, {"role": "user", "content": "hello"}])
    assert one != two


async def test_an_ambiguous_match_starts_a_new_session(gateway: Gateway) -> None:
    opening = [SYSTEM, {"role": "user", "content": "same start"}]
    one, answer = await _chat(gateway, opening)
    two, answer_two = await _chat(gateway, opening)
    assert one != two
    assert answer == answer_two  # two sessions with one context
    third, _ = await _chat(gateway, [*opening, answer, {"role": "user", "content": "which one?"}])
    assert third not in (one, two)
    assert [t["session_source"] for t in await _turns(gateway, third)] == ["new"]


async def test_an_edited_history_is_not_attached(gateway: Gateway) -> None:
    history = [SYSTEM, {"role": "user", "content": "question"}]
    first, answer = await _chat(gateway, history)
    edited = {**answer, "content": "an answer the client rewrote"}
    second, _ = await _chat(gateway, [*history, edited, {"role": "user", "content": "next"}])
    assert second != first


async def test_another_tenants_conversation_is_never_matched(make_gateway: Any) -> None:
    async with make_gateway(allow_unauthenticated=False, admin_key="admin") as gateway:
        admin = {"authorization": "Bearer admin"}
        keys = [
            (await gateway.client.post("/v1/admin/keys", json={"tenant": t}, headers=admin)).json()["key"]
            for t in ("t1", "t2")
        ]
        history = [SYSTEM, {"role": "user", "content": "private"}]
        mine, answer = await _chat(gateway, history, authorization=f"Bearer {keys[0]}")
        theirs, _ = await _chat(
            gateway, [*history, answer, {"role": "user", "content": "more"}], authorization=f"Bearer {keys[1]}"
        )
        assert theirs != mine


@pytest.mark.parametrize("header", ["x-dynamo-session-id", "x-session-token", "session-id", "session_id"])
async def test_other_gateways_and_agents_session_headers(gateway: Gateway, header: str) -> None:
    session_id = f"named-by-{header.replace('_', '-')}"
    got, _ = await _chat(gateway, [{"role": "user", "content": "hi"}], **{header: session_id})
    assert got == session_id
    assert [t["session_source"] for t in await _turns(gateway, session_id)] == ["header"]
