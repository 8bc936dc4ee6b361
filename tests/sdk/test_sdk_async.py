"""The async client mirrors the sync one: sessions, chat with history, retries, errors, settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from sessiongate import sdk
from sessiongate.sdk import AsyncSession, AsyncSessionGate

if TYPE_CHECKING:
    from .conftest import FakeGateway

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.anyio
async def test_async_session_lifecycle_and_history(aclient: AsyncSessionGate, gateway: FakeGateway) -> None:
    session = await aclient.sessions.create(session_id="sess_async", metadata={"k": "v"})
    assert isinstance(session, AsyncSession)
    reply = await session.chat(HI)
    assert reply.content == gateway.default_reply
    assert reply.session_id == "sess_async"
    await session.chat([{"role": "user", "content": "more"}])
    assert len(session.messages) == 4
    assert gateway.calls()[1].headers["x-session-id"] == "sess_async"

    loaded = await aclient.sessions.get("sess_async")
    assert loaded.messages == session.messages
    assert [turn.seq for turn in await loaded.turns()] == [1, 2]
    page = await aclient.sessions.list()
    assert [info.id for info in page.data] == ["sess_async"]
    await loaded.reload()
    assert loaded.info.turn_count == 2

    assert (await session.delete()).deleted
    with pytest.raises(sdk.NotFoundError) as info:
        await aclient.sessions.get("sess_async")
    assert info.value.status_code == 404
    assert info.value.request_id == "req_err_404"


@pytest.mark.anyio
async def test_async_retries_and_errors(aclient: AsyncSessionGate, gateway: FakeGateway, sleeps: list[float]) -> None:
    session = await aclient.sessions.create()
    gateway.script(gateway.error_response(429, "slow down", **{"retry-after": "2"}))
    await session.chat(HI)
    calls = gateway.calls()
    assert len(calls) == 2
    assert calls[0].headers["idempotency-key"] == calls[1].headers["idempotency-key"]
    assert sleeps == [2.0]

    before = list(session.messages)
    gateway.script(*[httpx.ConnectError("refused") for _ in range(3)])
    with pytest.raises(sdk.APIConnectionError):
        await session.chat([{"role": "user", "content": "lost"}])
    assert session.messages == before
    assert len(sleeps) == 3

    gateway.script(gateway.error_response(400, "bad"))
    with pytest.raises(sdk.BadRequestError):
        await aclient.chat.completions.create(messages=HI)


@pytest.mark.anyio
async def test_async_settings_and_injected_client(monkeypatch: pytest.MonkeyPatch, gateway: FakeGateway) -> None:
    monkeypatch.setenv("SESSIONGATE_BASE_URL", gateway.base_url)
    monkeypatch.setenv("SESSIONGATE_API_KEY", "sk-async")
    gateway.api_key = "sk-async"
    http_client = httpx.AsyncClient(transport=gateway.async_transport())
    async with AsyncSessionGate(http_client=http_client) as client:
        assert client.base_url == gateway.base_url
        await client.sessions.create()
    assert not http_client.is_closed
    await http_client.aclose()
    assert gateway.requests[0].headers["authorization"] == "Bearer sk-async"
