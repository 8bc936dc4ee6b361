"""Logs carry request, session and tenant ids, never keys, secrets or message content: a real gateway process
at debug level, its log read back after keyed, streamed, failed and refused requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from sessiongate.benchmarks.processes import FakeWorkerProcess, GatewayServer
from sessiongate.gateway.observability.redaction import Redactor

ADMIN_KEY = "admin-key-that-must-not-leak"
SALT_SECRET = "salt-secret-that-must-not-leak"
MARKER = "ZEBRA-CONTENT-MARKER"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayServer]:
    worker = FakeWorkerProcess(tmp_path)
    server = None
    try:
        worker.wait_ready()
        env = {
            "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
            "SESSIONGATE_ADMIN_KEY": ADMIN_KEY,
            "SESSIONGATE_CACHE_SALT_SECRET": SALT_SECRET,
            "SESSIONGATE_LOG_LEVEL": "debug",
        }
        server = GatewayServer(tmp_path, workers=[worker.url], env=env)
        server.wait_ready()
        yield server
    finally:
        if server is not None:
            server.stop()
        worker.stop()


def test_logs_hold_ids_but_no_secrets_or_content(gateway: GatewayServer) -> None:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{gateway.url}/v1/admin/keys", json={"tenant": "acme"}, headers=admin)
    secret = made.json()["key"]
    key = {"authorization": f"Bearer {secret}", "x-session-id": "logged-1"}
    message = {"role": "user", "content": f"{MARKER} please keep this private"}
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        assert client.post("/v1/chat/completions", json={"messages": [message]}, headers=key).status_code == 200
        streamed = client.post("/v1/chat/completions", json={"messages": [message], "stream": True}, headers=key)
        assert streamed.status_code == 200
        wrong = {"authorization": f"Bearer {secret[:-4]}XXXX"}
        assert client.post("/v1/chat/completions", json={"messages": [message]}, headers=wrong).status_code == 401
        bad = client.post("/v1/chat/completions", json={"messages": [message], "max_tokens": -1}, headers=key)
        assert bad.status_code == 400
        assert client.get("/v1/sessions/logged-1/messages", headers=key).status_code == 200

    log = gateway.log_tail(10_000_000)
    for leaked in (secret, secret[3:20], ADMIN_KEY, SALT_SECRET, MARKER):
        assert leaked not in log
    events = [orjson.loads(line) for line in log.splitlines() if line.startswith("{")]
    chats = [e for e in events if e.get("event") == "request" and e.get("path") == "/v1/chat/completions"]
    assert len(chats) == 4
    served = [e for e in chats if e["status"] == 200]
    assert all(e["request_id"] and e["session_id"] == "logged-1" and e["tenant_id"] == "acme" for e in served)


def test_redactor_rules() -> None:
    redact = Redactor(extra_secrets=("hunter22",))
    event = redact(
        None,
        "info",
        {
            "event": "x",
            "authorization": "Bearer sg-abc",
            "webhook_secret": "s",
            "messages": [{"content": "private"}],
            "error": "key sg-AAAAAAAAAAAAAAAA rejected; url postgresql://u:hunter22@db/x; Bearer abc.def",
            "detail": {"api_key": "k", "ok": "hunter22"},
            "session_id": "sess-1",
            "key_id": "key_0123",
        },
    )
    assert event["authorization"] == event["webhook_secret"] == "[redacted]"
    assert event["messages"] == "[content redacted]"
    assert "sg-AAAA" not in event["error"]
    assert "hunter22" not in event["error"]
    assert "abc.def" not in event["error"]
    assert event["detail"] == {"api_key": "[redacted]", "ok": "[redacted]"}
    assert (event["session_id"], event["key_id"]) == ("sess-1", "key_0123")
    assert Redactor(log_content=True)(None, "debug", {"content": "shown"})["content"] == "shown"
