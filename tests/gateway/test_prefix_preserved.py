"""The gateway never edits what makes a prompt: every body a worker receives carries the client's messages and
tools exactly as sent, whatever the gateway adds (the tenant's cache salt, the session's priority, the no-keep
rid, the cache report and usage options), so turn N+1's messages start with turn N's plus its answer.

The fake worker, which records the body it received, is enough here: the test is about our own edits of the
request body. Whether the worker's chat template and tokenizer then keep the token-id prefix is the real
engine's to show (tests/engine/test_gateway_edits_engine.py reads a real worker's token ids)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from sessiongate.sglang_ext.protocol import KEEP_HEADER

from .conftest import Gateway

pytestmark = pytest.mark.anyio

TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "Look it up.", "parameters": {"type": "object", "properties": {}}},
}


async def test_workers_receive_the_clients_messages_and_tools_unchanged(gateway: Gateway) -> None:
    await gateway.client.post("/v1/sessions", json={"session_id": "p", "priority": 5})
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "look something up"},
    ]
    sent: list[dict[str, Any]] = []
    variants: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"tools": [TOOL], "tool_choice": "required"}, {}),
        ({"tools": [TOOL], "stream": True}, {KEEP_HEADER: "false"}),
        ({"tools": [TOOL], "return_cached_tokens_details": True}, {}),
        ({"tools": [TOOL], "stream": True, "stream_options": {"include_usage": True}}, {}),
    ]
    for extra, headers in variants:
        body = {"messages": [dict(m) for m in messages], **extra}
        sent.append(body)
        answer = await gateway.client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "p", **headers})
        assert answer.status_code == 200, answer.text
        turn = (await gateway.client.get("/v1/sessions/p/turns")).json()["data"][-1]
        messages += [turn["output_message"], {"role": "user", "content": f"and then {len(sent)}"}]

    received = sorted(
        (body for worker in gateway.workers.values() for body in worker.requests), key=lambda b: len(b["messages"])
    )
    assert len(received) == len(sent)
    for client_body, worker_body in zip(sent, received, strict=True):
        assert worker_body["messages"] == client_body["messages"]
        assert worker_body["tools"] == client_body["tools"]
        assert worker_body["priority"] == 5
        assert worker_body["cache_salt"] == received[0]["cache_salt"]
    for earlier, later in itertools.pairwise(received):
        assert later["messages"][: len(earlier["messages"])] == earlier["messages"]
