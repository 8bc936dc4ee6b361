"""`Idempotency-Key`: a retry with the same key (same tenant, same request) gets the first answer, never a
second turn; a concurrent duplicate gets 409; a failed first attempt leaves the key free for the retry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
from sqlalchemy import select

from sessiongate.gateway.turn import idempotency
from sessiongate.sdk._sse import parse_events
from sessiongate.sessions import StoreUnavailable
from sessiongate.sessions.models import IdempotencyKey

from .conftest import SecureGateway, bearer

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "tell me a story"}


async def _turns(gw: SecureGateway, key: dict[str, str], session_id: str) -> list[dict[str, Any]]:
    return list((await gw.client.get(f"/v1/sessions/{session_id}/turns", headers=key)).json()["data"])


async def test_retry_returns_the_first_answer(gateway: SecureGateway) -> None:
    key = bearer(await gateway.new_key("acme"))
    headers = {**key, "idempotency-key": "retry-1"}
    first = await gateway.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
    again = await gateway.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
    assert first.status_code == again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    for header in ("x-session-id", "x-sessiongate-turn-id"):
        assert again.headers[header] == first.headers[header]  # the session created by the first attempt
    assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert again.json()["usage"]["total_tokens"] == first.json()["usage"]["total_tokens"]
    assert len(gateway.worker.requests) == 1
    assert len(await _turns(gateway, key, first.headers["x-session-id"])) == 1


async def test_streamed_retry_replays_the_stream(gateway: SecureGateway) -> None:
    key = bearer(await gateway.new_key("acme"))
    headers = {**key, "idempotency-key": "stream-1", "x-session-id": "st-1"}
    body = {"messages": [USER], "stream": True, "stream_options": {"include_usage": True}}
    first = await gateway.client.post("/v1/chat/completions", headers=headers, json=body)
    again = await gateway.client.post("/v1/chat/completions", headers=headers, json=body)

    def content(text: str) -> tuple[str, int]:
        events = [event.json() for event in parse_events(text) if not event.done]
        words = "".join(c["choices"][0]["delta"].get("content") or "" for c in events if c["choices"])
        usage = next(c["usage"]["total_tokens"] for c in events if c.get("usage"))
        return words, usage

    assert again.headers["idempotent-replayed"] == "true"
    assert again.text.endswith("data: [DONE]\n\n")
    assert content(again.text) == content(first.text)
    assert len(await _turns(gateway, key, "st-1")) == 1


async def test_same_key_with_another_request_is_refused(gateway: SecureGateway) -> None:
    key = bearer(await gateway.new_key("acme"))
    headers = {**key, "idempotency-key": "k-1", "x-session-id": "s-1"}
    assert (
        await gateway.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
    ).status_code == 200
    other = await gateway.client.post(
        "/v1/chat/completions", headers=headers, json={"messages": [{"role": "user", "content": "else"}]}
    )
    assert other.status_code == 400
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    bad = await gateway.client.post(
        "/v1/chat/completions", headers={**key, "idempotency-key": "no spaces allowed"}, json={"messages": [USER]}
    )
    assert bad.status_code == 400
    # Keys are per tenant: another tenant's identical key is its own request.
    globex = bearer(await gateway.new_key("globex"))
    theirs = await gateway.client.post(
        "/v1/chat/completions", headers={**globex, "idempotency-key": "k-1"}, json={"messages": [USER]}
    )
    assert theirs.status_code == 200
    assert "idempotent-replayed" not in theirs.headers


async def test_concurrent_duplicate_gets_409_and_one_turn(gateway: SecureGateway) -> None:
    key = bearer(await gateway.new_key("acme"))
    headers = {**key, "idempotency-key": "dup-1", "x-session-id": "dup"}
    gateway.worker.token_delay_s = 0.05
    statuses: list[int] = []

    async def first() -> None:
        statuses.append(
            (await gateway.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})).status_code
        )

    async with anyio.create_task_group() as group:
        group.start_soon(first)
        while not gateway.worker.requests:  # noqa: ASYNC110 (the fake worker has no event to wait on)
            await anyio.sleep(0.005)
        duplicate = await gateway.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
        assert duplicate.status_code == 409
        assert duplicate.json()["error"]["code"] == "idempotency_request_in_progress"
        assert duplicate.headers["retry-after"] == "1"
    assert statuses == [200]
    assert len(await _turns(gateway, key, "dup")) == 1
    after = await gateway.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
    assert after.headers["idempotent-replayed"] == "true"


async def test_a_failed_first_attempt_frees_the_key(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway() as gw:
        key = bearer(await gw.new_key("acme"))
        headers = {**key, "idempotency-key": "fail-1", "x-session-id": "f-1"}
        gw.worker.fail_status = 500
        assert (
            await gw.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
        ).status_code == 500
        gw.worker.fail_status = None
        retry = await gw.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
        assert retry.status_code == 200
        assert "idempotent-replayed" not in retry.headers
        assert [t["status"] for t in await _turns(gw, key, "f-1")] == ["failed", "ok"]


async def test_a_key_the_store_could_not_release_is_released_once_it_is_back(
    make_gateway: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt fails while the store is unreachable: its answer (the error) comes at once, its key's
    release is retried in the background, and the client's retry runs anew once the store answers again."""
    monkeypatch.setattr(idempotency, "_RETRY_DELAYS_S", (0.05,))
    async with make_gateway() as gw:
        key = bearer(await gw.new_key("acme"))
        headers = {**key, "idempotency-key": "unreleased-1", "x-session-id": "u-1"}
        store = gw.state.store
        release = store.release_idempotency_key
        refusals = 0

        async def unreachable_at_first(**kwargs: Any) -> None:
            nonlocal refusals
            if refusals < 3:
                refusals += 1
                raise StoreUnavailable("session store unavailable: the test's partition")
            await release(**kwargs)

        monkeypatch.setattr(store, "release_idempotency_key", unreachable_at_first)
        gw.worker.fail_status = 500
        with anyio.fail_after(5):
            failed = await gw.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
        assert failed.status_code == 500
        gw.worker.fail_status = None
        with anyio.fail_after(10):
            while await _claimed(gw, "acme", "unreleased-1"):  # noqa: ASYNC110 (polling the store)
                await anyio.sleep(0.02)
        assert refusals == 3  # the release asked by the failed turn and again by its request: one retry of both
        retry = await gw.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
        assert retry.status_code == 200
        assert "idempotent-replayed" not in retry.headers


async def test_keys_expire_after_the_retention(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(
        upstream_read_timeout_s=3.0, idempotency_retention_s=3.0, idempotency_sweep_interval_s=0.05
    ) as gw:
        key = bearer(await gw.new_key("acme"))
        headers = {**key, "idempotency-key": "expires-1", "x-session-id": "exp-1"}
        first = await gw.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
        assert first.status_code == 200
        again = await gw.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
        assert again.headers["idempotent-replayed"] == "true"  # still within the retention

        with anyio.fail_after(30):  # the sweeper deletes the key once it is older than the retention
            while await _claimed(gw, "acme", "expires-1"):  # noqa: ASYNC110 (polling the store)
                await anyio.sleep(0.1)
        late = await gw.client.post("/v1/chat/completions", headers=headers, json={"messages": [USER]})
        assert late.status_code == 200
        assert "idempotent-replayed" not in late.headers  # a retry that late runs anew
        assert len(await _turns(gw, key, "exp-1")) == 2


async def _claimed(gw: SecureGateway, tenant_id: str, key: str) -> bool:
    async with gw.state.store.engine.connect() as db:
        found = await db.scalar(
            select(IdempotencyKey.key).where(IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key)
        )
    return found is not None
