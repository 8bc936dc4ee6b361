"""Real answers of the gateway validate against the response schemas the OpenAPI document publishes
(sessiongate/gateway/api/openapi.py, hand-written): for every documented operation, its status code is one the document
lists for
it, its content type is documented, and a JSON body validates against the documented schema (jsonschema, draft
2020-12, `$ref`s into the document's components). Successes and the errors a client meets (400, 401, 403, 404,
409), each operation at least once with a 2xx answer."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from jsonschema import Draft202012Validator

from sessiongate.gateway.advisor.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from sessiongate.gateway.api.openapi import openapi_document
from sessiongate.gateway.workers.pool import worker_id_for
from sessiongate.sdk._sse import parse_events

from .conftest import Gateway, running_gateway

pytestmark = pytest.mark.anyio

ADMIN = {"authorization": "Bearer admin-key"}
SECRET = "webhook-secret"
DOCUMENT = openapi_document()
OPERATIONS = {(method.upper(), path) for path, ops in DOCUMENT["paths"].items() for method in ops}


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(
        tmp_path, admin_key="admin-key", webhook_secret=SECRET, allow_unauthenticated=False
    ) as gw:
        yield gw


def check(method: str, template: str, response: httpx.Response) -> None:
    """The answer is what the document says `method template` answers."""
    operation = DOCUMENT["paths"][template][method.lower()]
    status = str(response.status_code)
    assert status in operation["responses"], f"{method} {template}: {status} not documented: {response.text[:300]}"
    content = operation["responses"][status].get("content", {})
    media = response.headers.get("content-type", "").split(";")[0]
    assert media in content, f"{method} {template} {status}: content type {media!r} not documented"
    if media == "application/json":
        _validate(f"{method} {template} {status}", content[media]["schema"], response.json())
    if media == "text/event-stream":  # OpenAPI 3.1: the schema is each event's
        events = parse_events(response.content)
        assert events, f"{method} {template}: an empty stream"
        for event in events:
            _validate(f"{method} {template} event", content[media]["schema"], {"data": event.data, "event": "message"})
        if template == "/v1/responses":  # the Responses API's events: each names its type, the last completes
            kinds = [orjson.loads(event.data)["type"] for event in events]
            assert kinds[0] == "response.created"
            assert kinds[-1] == "response.completed"
            return
        assert events[-1].data == "[DONE]"
        chunks = [orjson.loads(event.data) for event in events[:-1]]
        assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)


def _validate(what: str, schema: dict[str, Any], value: Any) -> None:
    validator = Draft202012Validator({**schema, "components": DOCUMENT["components"]})
    errors = sorted(validator.iter_errors(value), key=str)
    assert errors == [], f"{what}: {errors[0].message} at {list(errors[0].absolute_path)}"


class Client:
    """Sends a request and checks its answer against the operation named by the path template."""

    def __init__(self, gateway: Gateway) -> None:
        self.http = gateway.client
        self.checked: dict[tuple[str, str], set[int]] = {}

    async def __call__(self, method: str, template: str, path: str | None = None, **kwargs: Any) -> httpx.Response:
        response = await self.http.request(method, path or template, **kwargs)
        check(method, template, response)
        self.checked.setdefault((method, template), set()).add(response.status_code)
        return response


async def test_every_operation_answers_as_documented(gateway: Gateway) -> None:
    call = Client(gateway)
    key = (await call("POST", "/v1/admin/keys", json={"tenant": "acme", "name": "ci"}, headers=ADMIN)).json()
    tenant = {"authorization": f"Bearer {key['key']}"}
    worker = gateway.ids["worker-a"]
    s = "/v1/sessions/{session_id}"
    a = "/v1/admin/sessions/{session_id}"

    # Public and tenant operations.
    await call("GET", "/healthz")
    await call("GET", "/readyz")
    await call("GET", "/metrics")
    await call("GET", "/openapi.json")
    await call("GET", "/v1/models", headers=tenant)
    await call("GET", "/v1/models")  # 401: no key
    await call("POST", "/v1/sessions", json={"session_id": "s1", "metadata": {"a": 1}}, headers=tenant)
    await call("POST", "/v1/sessions", json={"session_id": "s1"}, headers=tenant)  # 409
    await call("POST", "/v1/sessions", json={"priority": "high"}, headers=tenant)  # 400
    await call("GET", "/v1/sessions", headers=tenant)
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    await call("POST", "/v1/chat/completions", json=chat, headers={**tenant, "x-session-id": "s1"})
    await call("POST", "/v1/chat/completions", json={**chat, "stream": True}, headers={**tenant, "x-session-id": "s1"})
    await call("POST", "/v1/chat/completions", json={"messages": []}, headers=tenant)  # 400
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    answer = await call(
        "POST", "/v1/chat/completions", json={**chat, "tools": tools, "tool_choice": "required"},
        headers={**tenant, "x-session-id": "s1"},
    )  # fmt: skip
    calls = answer.json()["choices"][0]["message"].get("tool_calls") or [{"id": "none"}]
    r = "/v1/responses/{response_id}"
    made = (await call("POST", "/v1/responses", json={"input": "hi", "metadata": {"k": "v"}}, headers=tenant)).json()
    await call("POST", "/v1/responses", json={"input": "again", "previous_response_id": made["id"], "stream": True},
               headers=tenant)  # fmt: skip
    await call("POST", "/v1/responses", json={"input": "x", "previous_response_id": "resp_nope"}, headers=tenant)
    await call("POST", "/v1/responses", json={"input": 5}, headers=tenant)  # 400
    await call("GET", r, f"/v1/responses/{made['id']}", headers=tenant)
    await call("GET", r + "/input_items", f"/v1/responses/{made['id']}/input_items", headers=tenant)
    await call("GET", r + "/input_items", f"/v1/responses/{made['id']}/input_items?order=up", headers=tenant)  # 400
    await call("DELETE", r, f"/v1/responses/{made['id']}", headers=tenant)
    await call("DELETE", r, f"/v1/responses/{made['id']}", headers=tenant)  # 404
    await call("GET", s, "/v1/sessions/s1", headers=tenant)
    await call("GET", s, "/v1/sessions/nope", headers=tenant)  # 404
    await call("PATCH", s, "/v1/sessions/s1", json={"priority": 5, "metadata": {"b": 2}}, headers=tenant)
    await call("GET", s + "/turns", "/v1/sessions/s1/turns", headers=tenant)
    await call("GET", s + "/messages", "/v1/sessions/s1/messages", headers=tenant)
    await call("POST", s + "/fork", "/v1/sessions/s1/fork", json={"session_id": "s1-fork"}, headers=tenant)
    await call("POST", s + "/fork", "/v1/sessions/s1/fork", json={"at_turn": 0}, headers=tenant)  # 400
    await call("POST", s + "/fork", "/v1/sessions/s1/fork", json={"session_id": "s1-fork"}, headers=tenant)  # 409
    await call("POST", s + "/close", "/v1/sessions/s1-fork/close", headers=tenant)
    await call("POST", s + "/close", "/v1/sessions/nope/close", headers=tenant)  # 404
    await call("POST", s + "/typing", "/v1/sessions/s1/typing", json={"state": "started"}, headers=tenant)
    await call("POST", s + "/typing", "/v1/sessions/s1/typing", json={"state": "sideways"}, headers=tenant)  # 400
    result = {"tool_call_id": calls[0]["id"], "content": "42"}
    await call("POST", s + "/tool_results", "/v1/sessions/s1/tool_results", json=result, headers=tenant)
    await call("POST", s + "/advise", "/v1/sessions/s1/advise", json={"expected_in_ms": 500}, headers=tenant)
    await call("POST", s + "/advise", "/v1/sessions/s1/advise", headers=tenant)

    webhook = orjson.dumps({"session_id": "s1", "tenant_id": "acme", "state": "started"})
    stamp = str(int(time.time()))
    signed = {
        "content-type": "application/json",
        TIMESTAMP_HEADER: stamp,
        SIGNATURE_HEADER: sign(SECRET, stamp, webhook),
    }
    await call("POST", "/v1/webhooks/typing", content=webhook, headers=signed)
    await call("POST", "/v1/webhooks/typing", content=webhook, headers={**signed, SIGNATURE_HEADER: "sha256=00"})

    # Admin operations.
    await call("GET", "/v1/admin/sessions", headers=ADMIN)
    await call("GET", "/v1/admin/sessions", headers=tenant)  # 403
    await call("GET", "/v1/admin/sessions", params={"after": "nope"}, headers=ADMIN)  # 404: no such cursor
    await call("GET", "/v1/sessions", params={"after": "nope"}, headers=tenant)
    await call("GET", a, "/v1/admin/sessions/s1", headers=ADMIN)
    await call("GET", a, "/v1/admin/sessions/nope", headers=ADMIN)  # 404
    await call("PATCH", a, "/v1/admin/sessions/s1", json={"priority": 7}, headers=ADMIN)
    await call("POST", a + "/kv/retain", "/v1/admin/sessions/s1/kv/retain", json={"ttl_ms": 1000}, headers=ADMIN)
    await call("POST", a + "/kv/drop", "/v1/admin/sessions/s1/kv/drop", headers=ADMIN)
    await call("GET", "/v1/admin/workers", headers=ADMIN)
    await call("POST", "/v1/admin/workers/{worker_id}/drain", f"/v1/admin/workers/{worker}/drain", headers=ADMIN)
    await call("POST", "/v1/admin/workers/{worker_id}/undrain", f"/v1/admin/workers/{worker}/undrain", headers=ADMIN)
    await call("POST", "/v1/admin/workers/{worker_id}/drain", "/v1/admin/workers/nope/drain", headers=ADMIN)  # 404
    for url in gateway.urls.values():  # no routable worker: /readyz answers 503 with its checks
        await call(
            "POST",
            "/v1/admin/workers/{worker_id}/drain",
            f"/v1/admin/workers/{worker_id_for(url)}/drain",
            headers=ADMIN,
        )
    assert (await call("GET", "/readyz")).status_code == 503
    await call("POST", "/v1/chat/completions", json=chat, headers={**tenant, "x-session-id": "s1"})  # 503
    for url in gateway.urls.values():
        await call(
            "POST",
            "/v1/admin/workers/{worker_id}/undrain",
            f"/v1/admin/workers/{worker_id_for(url)}/undrain",
            headers=ADMIN,
        )
    await call("GET", "/v1/admin/advisories/stats", headers=ADMIN)
    await call("GET", "/v1/admin/keys", headers=ADMIN)
    await call("GET", "/v1/admin/tenants", headers=ADMIN)
    await call("GET", "/v1/admin/tenants/{tenant_id}", "/v1/admin/tenants/acme", headers=ADMIN)
    await call("GET", "/v1/admin/tenants/{tenant_id}", "/v1/admin/tenants/nobody", headers=ADMIN)  # 404
    limits = {"max_concurrent": 4, "tokens_per_minute": None}
    await call(
        "PUT", "/v1/admin/tenants/{tenant_id}/limits", "/v1/admin/tenants/acme/limits", json=limits, headers=ADMIN
    )
    await call("POST", a + "/close", "/v1/admin/sessions/s1/close", headers=ADMIN)
    await call("POST", "/v1/chat/completions", json=chat, headers={**tenant, "x-session-id": "s1"})  # closed: 409
    await call("POST", "/v1/sessions", json={"session_id": "s2"}, headers=tenant)
    await call("DELETE", s, "/v1/sessions/s2", headers=tenant)
    await call("DELETE", a, "/v1/admin/sessions/s1", headers=ADMIN)
    await call("DELETE", "/v1/admin/keys/{key_id}", f"/v1/admin/keys/{key['id']}", headers=ADMIN)
    await call("DELETE", "/v1/admin/keys/{key_id}", "/v1/admin/keys/nope", headers=ADMIN)  # 404

    assert set(call.checked) == OPERATIONS  # every documented operation was checked ...
    unanswered = sorted(op for op, statuses in call.checked.items() if not any(200 <= s < 300 for s in statuses))
    assert unanswered == []  # ... with a success at least once


def test_undocumented_answers_are_caught() -> None:
    """The check itself: a status, a content type or a body the document does not describe fails."""
    request = httpx.Request("GET", "http://gateway/v1/sessions/s1")
    with pytest.raises(AssertionError, match="not documented"):
        check("GET", "/v1/sessions/{session_id}", httpx.Response(418, json={}, request=request))
    with pytest.raises(AssertionError, match="content type"):
        check("GET", "/v1/sessions/{session_id}", httpx.Response(200, text="hi", request=request))
    with pytest.raises(AssertionError, match="is a required property"):
        check("GET", "/v1/sessions/{session_id}", httpx.Response(200, json={"id": "s1"}, request=request))
