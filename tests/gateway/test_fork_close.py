"""Fork and close through the real gateway (fake workers: what is tested is the gateway's own logic; the cache hit
of a fork's first turn on a real worker is in tests/examples/test_examples_engine.py, test_fork_subagents_example)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.conftest import Gateway

pytestmark = pytest.mark.anyio

SYSTEM = {"role": "system", "content": "You are a planner. " * 20}


async def _chat(gateway: Gateway, session_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    answer = await gateway.client.post(
        "/v1/chat/completions", json={"messages": messages}, headers={"x-session-id": session_id}
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["choices"][0]["message"])


async def _turns(gateway: Gateway, session_id: str) -> list[dict[str, Any]]:
    return list((await gateway.client.get(f"/v1/sessions/{session_id}/turns")).json()["data"])


async def _parent(gateway: Gateway) -> list[dict[str, Any]]:
    history = [SYSTEM, {"role": "user", "content": "plan a trip"}]
    history.append(await _chat(gateway, "parent", history))
    history.append({"role": "user", "content": "now in detail"})
    history.append(await _chat(gateway, "parent", history))
    return history


async def test_a_fork_shares_the_parents_context_and_its_first_turn_is_a_cache_hit(gateway: Gateway) -> None:
    history = await _parent(gateway)
    forked = await gateway.client.post("/v1/sessions/parent/fork", json={"session_id": "child-a"})
    assert forked.status_code == 201, forked.text
    assert (forked.json()["id"], forked.json()["forked_from"], forked.json()["shared_messages"]) == (
        "child-a",
        "parent",
        5,
    )
    messages = (await gateway.client.get("/v1/sessions/child-a/messages")).json()["data"]
    assert messages == history
    await _chat(gateway, "child-a", [*history, {"role": "user", "content": "sub-task A"}])
    turns = await _turns(gateway, "child-a")
    assert [(t["seq"], t["session_source"]) for t in turns] == [(1, "fork"), (2, "header")]
    assert turns[1]["context_reset"] is False  # it extends the shared context
    assert turns[1]["input_messages"] == [{"role": "user", "content": "sub-task A"}]
    parent_turns = await _turns(gateway, "parent")
    assert turns[1]["worker"] == parent_turns[-1]["worker"]  # routed where the parent's KV is
    assert turns[1]["usage"]["cached_tokens"] > 0
    # The parent goes on unchanged.
    assert len(parent_turns) == 2


async def test_a_fork_at_a_turn_and_errors(gateway: Gateway) -> None:
    history = await _parent(gateway)
    early = (await gateway.client.post("/v1/sessions/parent/fork", json={"at_turn": 1})).json()
    assert early["shared_messages"] == 3
    assert (await gateway.client.get(f"/v1/sessions/{early['id']}/messages")).json()["data"] == history[:3]
    assert (await gateway.client.post("/v1/sessions/parent/fork", json={"at_turn": 9})).status_code == 404
    assert (await gateway.client.post("/v1/sessions/nope/fork")).status_code == 404
    again = await gateway.client.post("/v1/sessions/parent/fork", json={"session_id": early["id"]})
    assert again.status_code == 409


async def test_close_frees_the_kv_everywhere_and_refuses_further_turns(gateway: Gateway) -> None:
    history = await _parent(gateway)
    closed = await gateway.client.post("/v1/sessions/parent/close")
    assert closed.status_code == 200, closed.text
    body = closed.json()
    assert body["state"] == "closed"
    assert {entry["worker"] for entry in body["kv"]} == set(gateway.ids.values())
    assert sum(entry["device_tokens"] for entry in body["kv"]) > 0  # its pages were found and dropped
    for behaviour in gateway.workers.values():
        assert ("drop", "parent") in behaviour.kv_ops
    refused = await gateway.client.post(
        "/v1/chat/completions", json={"messages": [*history, {"role": "user", "content": "more"}]},
        headers={"x-session-id": "parent"},
    )  # fmt: skip
    assert refused.status_code == 409


async def test_a_forks_close_keeps_the_context_it_shares_with_its_parent(gateway: Gateway) -> None:
    history = await _parent(gateway)
    forked = await gateway.client.post("/v1/sessions/parent/fork", json={"session_id": "child"})
    assert forked.status_code == 201, forked.text
    shared = forked.json()["shared_messages"]
    assert shared == len(history)
    own = [*history, {"role": "user", "content": "the child's own task"}]
    answered = await gateway.client.post(
        "/v1/chat/completions", json={"messages": own}, headers={"x-session-id": "child"}
    )
    assert answered.status_code == 200, answered.text
    assert (await gateway.client.post("/v1/sessions/child/close")).status_code == 200
    assert (await gateway.client.post("/v1/sessions/parent/close")).status_code == 200
    for behaviour in gateway.workers.values():
        bodies = dict(zip(behaviour.kv_ops, behaviour.kv_requests, strict=True))
        # The fork's drop names the messages its parent's context holds, whose pages stay; the parent's names none.
        assert bodies[("drop", "child")].keep_messages == shared
        assert bodies[("drop", "parent")].keep_messages == 0


async def test_deleting_a_chains_last_response_closes_its_session(gateway: Gateway) -> None:
    first = (await gateway.client.post("/v1/responses", json={"input": "hello"})).json()
    second = await gateway.client.post("/v1/responses", json={"input": "more", "previous_response_id": first["id"]})
    session_id = first["sessiongate"]["session_id"]
    assert (await gateway.client.delete(f"/v1/responses/{first['id']}")).status_code == 200
    assert (await gateway.client.get(f"/v1/sessions/{session_id}")).json()["state"] == "active"
    assert (await gateway.client.delete(f"/v1/responses/{second.json()['id']}")).status_code == 200
    assert (await gateway.client.get(f"/v1/sessions/{session_id}")).json()["state"] == "closed"
    for behaviour in gateway.workers.values():
        assert ("drop", session_id) in behaviour.kv_ops
