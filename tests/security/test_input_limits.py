"""Input bounds: message count, max_tokens, header size, body size, session-id format; each a clear 4xx in the
OpenAI error format, refused before anything is recorded or sent to a worker. And the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .conftest import SecureGateway, bearer

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hi"}


async def test_bounds_are_enforced_with_openai_errors(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(max_messages=3, max_output_tokens=100, max_header_bytes=2048, max_body_bytes=4096) as gw:
        key = bearer(await gw.new_key("acme"))
        cases: list[tuple[dict[str, Any], dict[str, str], int, str | None, str | None]] = [
            ({"messages": [USER] * 4}, {}, 400, "messages", "too_many_messages"),
            ({"messages": [USER], "max_tokens": 101}, {}, 400, "max_tokens", "max_tokens_too_large"),
            (
                {"messages": [USER], "max_completion_tokens": 10**9},
                {},
                400,
                "max_completion_tokens",
                "max_tokens_too_large",
            ),
            ({"messages": [USER], "max_tokens": 0}, {}, 400, "max_tokens", None),
            ({"messages": []}, {}, 400, "messages", None),
            ({"messages": [USER]}, {"x-session-id": "bad id with spaces"}, 400, "x-session-id", "invalid_session_id"),
            ({"messages": [USER]}, {"x-session-id": "a" * 129}, 400, "x-session-id", "invalid_session_id"),
            ({"messages": [USER]}, {"x-padding": "p" * 3000}, 431, None, "headers_too_large"),
            ({"messages": [{"role": "user", "content": "x" * 5000}]}, {}, 413, None, "request_too_large"),
        ]
        for body, headers, status, param, code in cases:
            answer = await gw.client.post("/v1/chat/completions", headers={**key, **headers}, json=body)
            assert answer.status_code == status, (body, headers, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert error["param"] == param
            if code is not None:
                assert error["code"] == code
        assert gw.worker.requests == []
        assert (await gw.client.get("/v1/sessions", headers=key)).json()["data"] == []  # nothing recorded
        ok = await gw.client.post("/v1/chat/completions", headers=key, json={"messages": [USER] * 3, "max_tokens": 100})
        assert ok.status_code == 200


async def test_openapi_document_is_published(gateway: SecureGateway) -> None:
    answer = await gateway.client.get("/openapi.json")  # public: it holds no tenant data
    assert answer.status_code == 200
    document = answer.json()
    assert document["openapi"].startswith("3.1")
    assert {"/v1/chat/completions", "/v1/sessions/{session_id}", "/v1/admin/keys"} <= set(document["paths"])
    chat = document["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["properties"]["messages"]["minItems"] == 1
