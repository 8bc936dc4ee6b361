"""The SDK against the real gateway app (real ASGI transport, real SQLite store, fake workers)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sessiongate.sdk import AsyncSessionGate, ConflictError, NotFoundError

from .conftest import Gateway

pytestmark = pytest.mark.anyio


@pytest.fixture
async def sdk(gateway: Gateway) -> AsyncIterator[AsyncSessionGate]:
    sleeps: list[float] = []

    async def no_wait(seconds: float) -> None:
        sleeps.append(seconds)

    transport = gateway.client._transport  # the gateway app, served with its lifespan state
    async with AsyncSessionGate(base_url="http://gateway", transport=transport, sleep=no_wait) as client:
        client.sleeps = sleeps  # type: ignore[attr-defined]
        yield client


async def test_session_conversation_through_the_sdk(gateway: Gateway, sdk: AsyncSessionGate) -> None:
    session = await sdk.sessions.create(session_id="sdk-1", metadata={"user": "ada"})
    first = await session.chat([{"role": "user", "content": "hello gateway"}])
    assert first.content == "echo: hello gateway"
    assert first.session_id == "sdk-1"
    stream = await session.chat([{"role": "user", "content": "tell me more"}], stream=True)
    pieces = [chunk.delta.content async for chunk in stream if chunk.delta and chunk.delta.content]
    assert "".join(pieces) == "echo: tell me more"
    assert stream.completion.usage is not None
    assert stream.completion.usage.cached_tokens > 0
    assert [m["role"] for m in session.messages] == ["user", "assistant", "user", "assistant"]

    turns = await session.turns()
    assert [t.status for t in turns] == ["ok", "ok"]
    reloaded = await sdk.sessions.get("sdk-1")
    assert reloaded.messages == session.messages  # the gateway's context equals the client's
    page = await sdk.sessions.list()
    assert [s.id for s in page.data] == ["sdk-1"]
    await sdk.sessions.delete("sdk-1")
    with pytest.raises(NotFoundError):
        await sdk.sessions.get("sdk-1")


async def test_duplicate_session_is_a_conflict_without_retries(sdk: AsyncSessionGate) -> None:
    await sdk.sessions.create(session_id="dup")
    with pytest.raises(ConflictError):
        await sdk.sessions.create(session_id="dup")
    assert sdk.sleeps == []  # type: ignore[attr-defined]


async def test_sdk_retries_a_503_until_a_worker_is_back(gateway: Gateway, sdk: AsyncSessionGate) -> None:
    pool = gateway.state.workers
    # The workers fail their health checks too, so the health loop cannot bring them back before the request.
    for behaviour in gateway.workers.values():
        behaviour.healthy = False
    for worker in pool.workers:
        worker.healthy = False

    async def worker_recovers(seconds: float) -> None:
        sdk.sleeps.append(seconds)  # type: ignore[attr-defined]
        for behaviour in gateway.workers.values():
            behaviour.healthy = True
        for worker in pool.workers:
            worker.healthy = True

    sdk._sleep = worker_recovers
    session = await sdk.sessions.create(session_id="retry")
    reply = await session.chat([{"role": "user", "content": "are you there"}])
    assert reply.content == "echo: are you there"
    assert len(sdk.sleeps) == 1  # type: ignore[attr-defined]
    turns = await session.turns()
    # The refused attempt is kept as a failed turn; the retry is a new, successful one.
    assert [t.status for t in turns] == ["failed", "ok"]
    assert turns[0].input_messages == turns[1].input_messages


async def test_sdk_sees_typed_errors_from_the_gateway(sdk: AsyncSessionGate) -> None:
    with pytest.raises(NotFoundError) as info:
        await sdk.sessions.get("missing")
    assert info.value.status_code == 404
    assert info.value.request_id


def test_transport_is_httpx() -> None:
    assert issubclass(httpx.ASGITransport, httpx.AsyncBaseTransport)


async def test_fork_and_close_through_the_sdk(gateway: Gateway, sdk: AsyncSessionGate) -> None:
    parent = await sdk.sessions.create()
    await parent.chat([{"role": "system", "content": "Plan. " * 30}, {"role": "user", "content": "a trip"}])
    child = await parent.fork()
    assert child.id != parent.id
    assert child.messages == parent.messages  # the shared context, loaded
    await child.chat([{"role": "user", "content": "the first leg"}])
    turns = await child.turns()
    assert [t.seq for t in turns] == [1, 2]
    assert turns[1].usage is not None
    assert turns[1].usage.cached_tokens > 0
    closed = await child.close()
    assert closed.info.state == "closed"
    assert child.info.state == "closed"
    assert closed.dropped_tokens > 0
    early = await sdk.sessions.fork(parent.id, at_turn=1, child_id="early-fork")
    assert early.id == "early-fork"
