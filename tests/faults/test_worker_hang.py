"""A worker that hangs (its process stopped with SIGSTOP): the client gets a bounded timeout, the turn is
failed, and once the worker resumes the session goes on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from sessiongate.sdk._sse import iter_events

from .conftest import LONG_QUESTION


def _turns(url: str, session_id: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{url}/v1/sessions/{session_id}/turns", timeout=10).json()["data"])


def test_hung_worker_times_out_before_and_during_the_stream(
    start_worker: Callable[..., Any], start_gateway: Callable[..., Any]
) -> None:
    worker = start_worker(token_delay_s=0.1)
    # Health checks slower than the test, so the hung worker stays routable: the timeout is what is tested.
    gateway = start_gateway([worker.url], upstream_read_timeout_s="1.5", health_interval_s="60", health_timeout_s="30")
    user = {"role": "user", "content": LONG_QUESTION}

    # Hung before the first byte: a 504 in the OpenAI format, after about the read timeout.
    worker.pause()
    try:
        started = time.monotonic()
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"messages": [user]},
            headers={"x-session-id": "hang-1"},
            timeout=30,
        )
        waited = time.monotonic() - started
    finally:
        worker.resume()
    assert answer.status_code == 504
    assert answer.json()["error"]["code"] == "worker_timeout"
    assert 1.4 <= waited < 5

    # Hung mid-stream: an error event, then the stream ends.
    events: list[dict[str, Any]] = []
    body = {"messages": [user], "stream": True, "max_tokens": 60}
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, headers={"x-session-id": "hang-1"}, timeout=30
    ) as response:
        assert response.status_code == 200
        for event in iter_events(response.iter_lines()):
            if not event.done:
                events.append(event.json())
                if len(events) == 3:
                    worker.pause()
    worker.resume()
    assert events[-1]["error"]["code"] == "worker_timeout"
    assert [t["status"] for t in _turns(gateway.url, "hang-1")] == ["failed", "failed"]

    # Resumed: the session goes on.
    ok = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "short one"}]},
        headers={"x-session-id": "hang-1"},
        timeout=30,
    )
    assert ok.status_code == 200
    assert [t["status"] for t in _turns(gateway.url, "hang-1")] == ["failed", "failed", "ok"]
