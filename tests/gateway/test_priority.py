"""The session's priority reaches the worker with every turn, bounded per tenant; a client cannot send its own
`priority` or `rid` (400, naming the parameter), so it cannot rank its KV above other tenants' or take another
request's id. The fake worker records the body it received: the test is about the gateway's own edits (a real
worker receiving the value is tested in tests/engine/test_gateway_edits_engine.py)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Gateway, running_gateway

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "rank my KV please"}
ADMIN = {"authorization": "Bearer admin-secret"}


def _sent(gateway: Gateway) -> list[dict[str, Any]]:
    return [body for worker in gateway.workers.values() for body in worker.requests]


async def _turn(gateway: Gateway, session: str, **extra: Any) -> Any:
    return await gateway.client.post(
        "/v1/chat/completions", json={"messages": [USER], **extra}, headers={"X-Session-Id": session}
    )


async def test_each_turn_carries_its_sessions_priority(gateway: Gateway) -> None:
    created = await gateway.client.post("/v1/sessions", json={"session_id": "ranked", "priority": 7})
    assert created.status_code == 201, created.text
    assert (await _turn(gateway, "ranked")).status_code == 200
    assert (await _turn(gateway, "unranked")).status_code == 200  # created by its first turn: priority 0
    await gateway.client.patch("/v1/sessions/ranked", json={"priority": -2})
    assert (await _turn(gateway, "ranked", stream=True)).status_code == 200
    assert sorted(body["priority"] for body in _sent(gateway)) == [-2, 0, 7]  # two workers: order is theirs


@pytest.mark.parametrize(("param", "value"), [("priority", 1000), ("rid", "someone-elses-request")])
async def test_a_client_cannot_send_priority_or_rid(gateway: Gateway, param: str, value: Any) -> None:
    for stream in (False, True):
        refused = await _turn(gateway, "bold", **{param: value, "stream": stream})
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == param
    assert _sent(gateway) == []  # nothing reached a worker


async def test_a_tenant_may_not_rank_a_session_above_the_bound(tmp_path: Any) -> None:
    async with running_gateway(tmp_path, tenant_max_priority=3, admin_key="admin-secret") as gw:
        for method, path in (("POST", "/v1/sessions"), ("PATCH", "/v1/sessions/capped")):
            if method == "PATCH":
                assert (await gw.client.post("/v1/sessions", json={"session_id": "capped"})).status_code == 201
            refused = await gw.client.request(method, path, json={"priority": 4})
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "priority"
        assert (await gw.client.patch("/v1/sessions/capped", json={"priority": 3})).status_code == 200
        # The operator is not bounded: an admin raise reaches the worker as set.
        raised = await gw.client.patch("/v1/admin/sessions/capped", json={"priority": 50}, headers=ADMIN)
        assert raised.status_code == 200, raised.text
        assert (await _turn(gw, "capped")).status_code == 200
        assert [body["priority"] for body in _sent(gw)] == [50]
