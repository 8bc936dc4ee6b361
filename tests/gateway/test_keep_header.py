"""`X-Sessiongate-Keep: false`: the gateway marks the turn's upstream request so the worker keeps none of its KV."""

from __future__ import annotations

import pytest

from sessiongate.sglang_ext.protocol import KEEP_HEADER, NO_KEEP_RID_PREFIX

from .conftest import Gateway

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "a one-off question with a secret in it"}


@pytest.mark.parametrize(("header", "marked"), [("false", True), ("False ", True), ("true", False), (None, False)])
async def test_the_keep_header_marks_the_upstream_request(gateway: Gateway, header: str | None, marked: bool) -> None:
    headers = {"X-Session-Id": "s-keep"}
    if header is not None:
        headers[KEEP_HEADER] = header
    response = await gateway.client.post(
        "/v1/chat/completions", json={"model": "fake-model", "messages": [USER]}, headers=headers
    )
    assert response.status_code == 200, response.text
    sent = [body for worker in gateway.workers.values() for body in worker.requests]
    assert len(sent) == 1
    rid = sent[0].get("rid")
    if marked:
        assert rid == f"{NO_KEEP_RID_PREFIX}{response.headers['x-sessiongate-turn-id']}"
    else:
        assert rid is None
