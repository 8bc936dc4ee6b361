"""The gateway killed (SIGKILL) mid-stream: after the restart the interrupted turn is failed at once (not after
the read timeout), the session continues, and another replica's turn in flight is left alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from .conftest import LONG_QUESTION


def _stream_in_background(url: str, session_id: str, received: list[bytes]) -> threading.Thread:
    def run() -> None:
        body = {"messages": [{"role": "user", "content": LONG_QUESTION}], "stream": True, "max_tokens": 60}
        try:
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=body, headers={"x-session-id": session_id}, timeout=30
            ) as response:
                for chunk in response.iter_bytes():
                    received.append(chunk)
        except httpx.HTTPError as exc:
            received.append(f"error: {type(exc).__name__}".encode())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _turns(url: str, session_id: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{url}/v1/sessions/{session_id}/turns", timeout=10).json()["data"])


def test_restarted_gateway_fails_its_interrupted_turn_at_once(
    start_worker: Callable[..., Any], start_gateway: Callable[..., Any]
) -> None:
    worker = start_worker(token_delay_s=0.1)
    first = start_gateway([worker.url], instance_id="replica-a")
    other = start_gateway([worker.url], instance_id="replica-b")  # a second replica on the same store

    cut: list[bytes] = []
    alive: list[bytes] = []
    cut_thread = _stream_in_background(first.url, "crash-1", cut)
    alive_thread = _stream_in_background(other.url, "other-1", alive)
    deadline = time.monotonic() + 10
    while (len(cut) < 3 or len(alive) < 3) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(cut) >= 3  # the stream is under way
    first.kill()
    cut_thread.join(10)
    assert b"[DONE]" not in b"".join(cut)  # the client saw its stream cut

    started = time.monotonic()
    restarted = start_gateway([worker.url], port=first.port, instance_id="replica-a")
    turns = _turns(restarted.url, "crash-1")
    assert [t["status"] for t in turns] == ["failed"]
    assert turns[0]["error"]["type"] == "interrupted"
    assert turns[0]["input_messages"][0]["content"] == LONG_QUESTION  # what the user sent is kept
    assert time.monotonic() - started < 20  # at the restart, not after upstream_read_timeout_s (300 s)

    # The other replica's turn was in flight during the restart: it is not this replica's to fail.
    alive_thread.join(30)
    assert b"[DONE]" in b"".join(alive)
    assert [t["status"] for t in _turns(other.url, "other-1")] == ["ok"]

    # The session continues on the restarted gateway.
    answer = httpx.post(
        f"{restarted.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "again please"}], "max_tokens": 5},
        headers={"x-session-id": "crash-1"},
        timeout=30,
    )
    assert answer.status_code == 200
    assert [t["status"] for t in _turns(restarted.url, "crash-1")] == ["failed", "ok"]
