"""A live advisory is re-targeted when a later signal finds its worker no longer the router's choice: through the
real app, against fake workers speaking the extension."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from .conftest import Gateway
from .test_signals import FAST, USER, _advisories, _settled, _turn, eventually

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


async def _tool_call_turn(gw: Gateway, session: str) -> dict[str, Any]:
    response = await gw.client.post(
        "/v1/chat/completions",
        json={"messages": [USER], "tools": TOOLS, "tool_choice": "required"},
        headers={"X-Session-Id": session},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    body["worker"] = response.headers["x-sessiongate-worker"]
    return body


async def test_tool_result_moves_the_tool_call_advisory_off_a_worker_that_got_busy(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        first = await _tool_call_turn(gw, "retarget-1")
        home = gw.name_of(first["worker"])
        other = "worker-b" if home == "worker-a" else "worker-a"

        async def tool_call_advisory() -> bool:
            return any(a.kind == "tool_call" for a in await _advisories(gw, "retarget-1"))

        await eventually(tool_call_advisory)  # the turn ended with a tool call: advised at once, at home
        (early,) = await _advisories(gw, "retarget-1")
        assert early.target_worker == gw.ids[home]

        gw.workers[home].queued = 40  # while the tool runs, the session's worker gets busy
        await asyncio.sleep(0.1)
        call = first["choices"][0]["message"]["tool_calls"][0]
        result = await gw.client.post(
            "/v1/sessions/retarget-1/tool_results", json={"tool_call_id": call["id"], "content": "found it"}
        )
        assert result.status_code == 202, result.text
        advisory = result.json()["advisory"]
        assert advisory["state"] == "fired"  # a new advisory, not the stale one refreshed
        assert advisory["kind"] == "tool_result"
        assert advisory["worker"] == gw.ids[other]

        async def believed_on_other() -> bool:
            kv = gw.state.router.belief.residency("retarget-1", gw.state.router.clock())
            return bool(kv.device.get(gw.ids[other], 0) > 0)

        await eventually(believed_on_other)
        message = first["choices"][0]["message"]
        tool_message = {"role": "tool", "tool_call_id": call["id"], "content": "found it"}
        second = await _turn(gw, "retarget-1", [USER, message, tool_message])
        assert second["worker"] == gw.ids[other]
        settled = {a.kind: a for a in await _settled(gw, "retarget-1", count=2)}
        assert settled["tool_call"].outcome == "cancelled"  # superseded: not counted against the hint
        assert settled["tool_result"].outcome == "used"
        assert settled["tool_result"].turn_id == second["sessiongate"]["turn_id"]


async def test_repeated_typing_keeps_its_advisory_while_its_worker_is_still_a_good_choice(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        await _turn(gw, "retarget-2", [USER])
        first = (await gw.client.post("/v1/sessions/retarget-2/typing", json={"state": "started"})).json()
        for _ in range(5):  # idle workers score alike: the reservation keeps the choice from rotating
            again = (await gw.client.post("/v1/sessions/retarget-2/typing", json={"state": "started"})).json()
            assert (again["state"], again["id"], again["worker"]) == ("refreshed", first["id"], first["worker"])
        assert len(await _advisories(gw, "retarget-2")) == 1
