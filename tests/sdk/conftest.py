"""An in-process stand-in of the gateway for the SDK tests, speaking its wire format over httpx.MockTransport.

Tests reach it only through the fixtures below (`gateway`, `client`, `aclient`, `sleeps`), never by
importing this module. `FakeGateway.handle` serves sessions, messages, turns and chat completions (JSON and
SSE) from memory and logs every request. Failure injection: `gateway.script(...)` queues responses or
transport exceptions to be returned before normal handling; `gateway.stream_failure` breaks the next
streams in one of three ways.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from sessiongate.sdk import AsyncSessionGate, SessionGate

BASE_URL = "http://gateway.test"
REPLY = "Hello there, agent!"


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def error_response(
    status: int, message: str, *, type_: str = "invalid_request_error", **headers: str
) -> httpx.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": f"http_{status}"}}
    return httpx.Response(status, json=body, headers={"x-request-id": f"req_err_{status}", **headers})


class BrokenStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body that yields some bytes, then fails as a dropped connection would."""

    def __init__(self, head: bytes) -> None:
        self.head = head

    def __iter__(self) -> Iterator[bytes]:
        yield self.head
        raise httpx.ReadError("connection reset by peer")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        raise httpx.ReadError("connection reset by peer")


class FakeGateway:
    base_url = BASE_URL
    default_reply = REPLY
    error_response = staticmethod(error_response)

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, Any]] = {}
        self.context: dict[str, list[dict[str, Any]]] = {}
        self.turns: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[httpx.Request] = []
        self.reply_content: str | None = REPLY
        self.reply_tool_calls: list[dict[str, Any]] = []
        self.stream_failure: str | None = None  # "error_event" | "truncate" | "read_error"
        self.api_key: str | None = None
        self._script: list[httpx.Response | Exception] = []
        self._ids = itertools.count(1)

    # -- test helpers ----------------------------------------------------------------------------------------
    def script(self, *actions: httpx.Response | Exception) -> None:
        self._script.extend(actions)

    def bodies(self, path: str = "/v1/chat/completions") -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.url.path == path]

    def calls(self, path: str = "/v1/chat/completions") -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path == path]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def async_transport(self) -> httpx.MockTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            await request.aread()
            return self.handle(request)

        return httpx.MockTransport(handle)

    # -- the wire format -------------------------------------------------------------------------------------
    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self._script:
            action = self._script.pop(0)
            if isinstance(action, Exception):
                raise action
            return action
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return error_response(401, "Invalid API key.", type_="authentication_error")
        parts = request.url.path.strip("/").split("/")
        method = request.method
        if parts == ["v1", "chat", "completions"] and method == "POST":
            return self._chat(request)
        if parts == ["v1", "sessions"] and method == "POST":
            return self._create(json.loads(request.content))
        if parts == ["v1", "sessions"] and method == "GET":
            return self._list(request.url.params)
        if len(parts) >= 3 and parts[:2] == ["v1", "sessions"]:
            session_id = parts[2]
            if session_id not in self.sessions:
                return error_response(404, f"Session {session_id} not found.")
            if len(parts) == 3 and method == "GET":
                return httpx.Response(200, json=self.sessions[session_id])
            if len(parts) == 3 and method == "DELETE":
                del self.sessions[session_id]
                return httpx.Response(200, json={"id": session_id, "object": "session.deleted", "deleted": True})
            if parts[3:] == ["messages"]:
                return httpx.Response(200, json={"object": "list", "data": self.context[session_id]})
            if parts[3:] == ["turns"]:
                return httpx.Response(200, json={"object": "list", "data": self.turns[session_id]})
        return error_response(404, "No such route.")

    def _new_session(self, session_id: str | None, priority: int = 0, metadata: Any = None) -> dict[str, Any]:
        session_id = session_id or f"sess_{next(self._ids):04d}"
        stamp = now_iso()
        self.sessions[session_id] = {
            "id": session_id,
            "object": "session",
            "tenant_id": "default",
            "state": "active",
            "priority": priority,
            "metadata": metadata or {},
            "created_at": stamp,
            "last_active_at": stamp,
            "turn_count": 0,
        }
        self.context[session_id] = []
        self.turns[session_id] = []
        return self.sessions[session_id]

    def _create(self, body: dict[str, Any]) -> httpx.Response:
        if body.get("session_id") in self.sessions:
            return error_response(409, "Session already exists.", **{"x-should-retry": "false"})
        session = self._new_session(body.get("session_id"), body.get("priority", 0), body.get("metadata"))
        return httpx.Response(201, json=session)

    def _list(self, params: httpx.QueryParams) -> httpx.Response:
        ids = sorted(self.sessions)
        if "after" in params:
            ids = [i for i in ids if i > params["after"]]
        limit = int(params.get("limit", 20))
        data = [self.sessions[i] for i in ids[:limit]]
        return httpx.Response(200, json={"object": "list", "data": data, "has_more": len(ids) > limit})

    def _chat(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        session_id = request.headers.get("x-session-id")
        if session_id is not None and session_id not in self.sessions:
            self._new_session(session_id)
        turn_id = f"turn_{next(self._ids):04d}"
        message: dict[str, Any] = {"role": "assistant", "content": self.reply_content}
        if self.reply_tool_calls:
            message["tool_calls"] = self.reply_tool_calls
        finish = "tool_calls" if self.reply_tool_calls else "stop"
        usage = {
            "prompt_tokens": 10 * len(body["messages"]),
            "completion_tokens": 5,
            "total_tokens": 10 * len(body["messages"]) + 5,
            "prompt_tokens_details": {"cached_tokens": 8},
            "cached_tokens_details": {"device": 4, "host": 3, "storage": 1},
        }
        gateway = {"session_id": session_id, "turn_id": turn_id, "worker": "worker-1"}
        headers = {"x-request-id": f"req_{turn_id}", "x-sessiongate-worker": "worker-1"}
        if session_id is not None:
            headers |= {"x-session-id": session_id, "x-sessiongate-turn-id": turn_id}
            self._record_turn(session_id, turn_id, body["messages"], message, finish, usage)
        if not body.get("stream"):
            completion = {
                "id": f"chatcmpl-{turn_id}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "tiny-model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
                "sessiongate": gateway,
            }
            return httpx.Response(200, json=completion, headers=headers)
        events = self._chunks(body, message, finish, usage, gateway, turn_id)
        headers["content-type"] = "text/event-stream"
        if self.stream_failure == "error_event":
            error = {"error": {"message": "worker crashed", "type": "server_error", "param": None, "code": "x"}}
            events = [*events[:2], error]
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
        if self.stream_failure == "read_error":
            return httpx.Response(200, stream=BrokenStream(sse[: len(sse) // 2].encode()), headers=headers)
        if self.stream_failure is None:
            sse += "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers=headers)

    def _chunks(
        self,
        body: dict[str, Any],
        message: dict[str, Any],
        finish: str,
        usage: dict[str, Any],
        gateway: dict[str, Any],
        turn_id: str,
    ) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        content = message["content"] or ""
        deltas += [{"content": content[i : i + 4]} for i in range(0, len(content), 4)]
        for index, call in enumerate(message.get("tool_calls", [])):
            args = call["function"]["arguments"]
            head = {"index": index, "id": call["id"], "type": "function"}
            deltas.append({"tool_calls": [head | {"function": {"name": call["function"]["name"], "arguments": ""}}]})
            half = len(args) // 2
            deltas += [
                {"tool_calls": [{"index": index, "function": {"arguments": part}}]}
                for part in (args[:half], args[half:])
            ]
        base = {
            "id": f"chatcmpl-{turn_id}",
            "object": "chat.completion.chunk",
            "model": body.get("model", "tiny-model"),
        }
        chunks = [base | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks.append(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        chunks.append(base | {"choices": [], "usage": usage, "sessiongate": gateway})
        return chunks

    def _record_turn(
        self,
        session_id: str,
        turn_id: str,
        messages: list[dict[str, Any]],
        output: dict[str, Any],
        finish: str,
        usage: dict[str, Any],
    ) -> None:
        known = len(self.context[session_id])
        stamp = now_iso()
        self.turns[session_id].append(
            {
                "id": turn_id,
                "object": "session.turn",
                "session_id": session_id,
                "seq": len(self.turns[session_id]) + 1,
                "status": "completed",
                "input_messages": messages[known:],
                "context_reset": known > len(messages),
                "output_message": output,
                "finish_reason": finish,
                "model": "tiny-model",
                "worker": "worker-1",
                "error": None,
                "usage": {
                    "prompt_tokens": usage["prompt_tokens"],
                    "completion_tokens": usage["completion_tokens"],
                    "cached_tokens": 8,
                    "cached_tokens_details": usage["cached_tokens_details"],
                },
                "timings": {
                    "received_at": stamp,
                    "dispatched_at": stamp,
                    "first_token_at": stamp,
                    "ended_at": stamp,
                },
                "tool_calls": [
                    {
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"],
                        "requested_at": stamp,
                        "result": None,
                        "returned_at": None,
                        "duration_ms": None,
                    }
                    for c in output.get("tool_calls", [])
                ],
            }
        )
        self.context[session_id] = [*messages, output]
        self.sessions[session_id]["turn_count"] += 1


@pytest.fixture
def gateway() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(gateway: FakeGateway, sleeps: list[float]) -> Iterator[SessionGate]:
    with SessionGate(base_url=BASE_URL, transport=gateway.transport(), sleep=sleeps.append) as sync_client:
        yield sync_client


@pytest.fixture
async def aclient(gateway: FakeGateway, sleeps: list[float]) -> AsyncIterator[AsyncSessionGate]:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with AsyncSessionGate(base_url=BASE_URL, transport=gateway.async_transport(), sleep=sleep) as async_client:
        yield async_client
