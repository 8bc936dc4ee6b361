"""Bad input and failing workers: clear OpenAI-format errors, and the user's turn kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from sessiongate.sdk._sse import parse_events

from .conftest import Gateway

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hello there"}


def _assert_openai_error(response: Any, status: int, error_type: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if error_type is not None:
        assert error["type"] == error_type
    assert response.headers.get("x-request-id")
    return dict(error)


async def test_malformed_json(gateway: Gateway) -> None:
    response = await gateway.client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    error = _assert_openai_error(response, 400, "invalid_request_error")
    assert error["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [USER], "max_tokens": "many"}, "max_tokens"),
        ({"messages": [USER], "stream": "yes please"}, "stream"),
        ({"model": "m"}, "messages"),
    ],
)
async def test_wrong_types_name_the_parameter(gateway: Gateway, body: dict[str, Any], param: str) -> None:
    response = await gateway.client.post("/v1/chat/completions", json=body)
    error = _assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] == param


async def test_body_that_is_not_an_object(gateway: Gateway) -> None:
    response = await gateway.client.post("/v1/chat/completions", json=[1, 2])
    _assert_openai_error(response, 400, "invalid_request_error")


async def test_invalid_session_id(gateway: Gateway) -> None:
    response = await gateway.client.post(
        "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "bad id with spaces"}
    )
    error = _assert_openai_error(response, 400)
    assert error["param"] == "x-session-id"


async def test_unknown_session(gateway: Gateway) -> None:
    for path in ("/v1/sessions/nope", "/v1/sessions/nope/turns", "/v1/sessions/nope/messages"):
        error = _assert_openai_error(await gateway.client.get(path), 404, "not_found_error")
        assert error["code"] == "session_not_found"
    _assert_openai_error(await gateway.client.delete("/v1/sessions/nope"), 404)


async def test_unknown_route_and_method(gateway: Gateway) -> None:
    _assert_openai_error(await gateway.client.get("/v1/nothing"), 404)
    _assert_openai_error(await gateway.client.get("/v1/chat/completions"), 405)


async def test_oversized_body_is_refused(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(max_body_bytes=2048) as gw:
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        response = await gw.client.post("/v1/chat/completions", json=big)
        error = _assert_openai_error(response, 413)
        assert error["code"] == "request_too_large"

        async def chunks() -> Any:  # no content-length: the limit is enforced while reading
            data = orjson.dumps(big)
            for i in range(0, len(data), 1000):
                yield data[i : i + 1000]

        response = await gw.client.post("/v1/chat/completions", content=chunks())
        _assert_openai_error(response, 413)


async def _turns(gw: Gateway, session_id: str) -> list[dict[str, Any]]:
    return list((await gw.client.get(f"/v1/sessions/{session_id}/turns")).json()["data"])


async def test_all_workers_down_gives_503_and_keeps_the_turn(gateway: Gateway) -> None:
    for worker in gateway.workers.values():
        worker.healthy = False
    for worker in gateway.state.workers.workers:
        await gateway.state.workers.check(worker)
        await gateway.state.workers.check(worker)
    response = await gateway.client.post(
        "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "down"}
    )
    error = _assert_openai_error(response, 503, "service_unavailable")
    assert error["code"] == "no_healthy_worker"
    (turn,) = await _turns(gateway, "down")
    assert turn["status"] == "failed"
    assert turn["input_messages"] == [USER]
    assert turn["error"]["message"]


async def test_worker_error_status_is_relayed_and_the_turn_failed(gateway: Gateway) -> None:
    for worker in gateway.workers.values():
        worker.fail_status = 400
    response = await gateway.client.post(
        "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "rejected"}
    )
    error = _assert_openai_error(response, 400)
    assert "injected failure" in error["message"]
    (turn,) = await _turns(gateway, "rejected")
    assert turn["status"] == "failed"


async def test_worker_dying_mid_stream_ends_with_an_error_event(gateway: Gateway) -> None:
    for worker in gateway.workers.values():
        worker.die_after_chunks = 2
    response = await gateway.client.post(
        "/v1/chat/completions", json={"messages": [USER], "stream": True}, headers={"X-Session-Id": "midway"}
    )
    assert response.status_code == 200
    events = [event.data for event in parse_events(response.text)]
    assert "[DONE]" not in events
    last = orjson.loads(events[-1])
    assert last["error"]["type"] == "upstream_error"
    (turn,) = await _turns(gateway, "midway")
    assert turn["status"] == "failed"
    assert turn["input_messages"] == [USER]
    assert turn["output_message"]["content"].startswith("echo:")  # the partial answer is kept


async def test_a_stream_that_fails_midway_is_charged_and_a_refused_one_is_not(make_gateway: Callable[..., Any]) -> None:
    """A budget of 8 tokens a minute: a worker that refuses the turn (no work done) costs nothing, so the
    next request is admitted; a stream that dies after two chunks cost its prompt (~12 estimated tokens) plus
    the relayed chunks, so the next request is refused."""
    async with make_gateway(tenant_tokens_per_minute=8) as gw:
        for worker in gw.workers.values():
            worker.fail_status = 500
        refused = await gw.client.post("/v1/chat/completions", json={"messages": [USER], "stream": True})
        assert refused.status_code == 500  # the worker's status, relayed
        for worker in gw.workers.values():
            worker.fail_status, worker.die_after_chunks = None, 2
        cut = await gw.client.post("/v1/chat/completions", json={"messages": [USER], "stream": True})
        assert cut.status_code == 200
        assert '"upstream_error"' in cut.text
        spent = await gw.client.post("/v1/chat/completions", json={"messages": [USER]})
        assert spent.status_code == 429, spent.text
        assert spent.json()["error"]["code"] == "tokens_per_minute_exceeded"


async def test_hanging_worker_times_out_with_504(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(upstream_read_timeout_s=0.3) as gw:
        for worker in gw.workers.values():
            worker.hang = True
        response = await gw.client.post(
            "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "hang"}
        )
        error = _assert_openai_error(response, 504)
        assert error["code"] == "worker_timeout"
        (turn,) = await _turns(gw, "hang")
        assert turn["status"] == "failed"
