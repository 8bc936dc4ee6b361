"""The SDK's signals and admin client against the real gateway app (real SQLite store, fake workers speaking
SGLang's API and the extension's): a hint before a turn makes an advisory whose outcome shows on that turn."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import jsonschema
import pytest

from sessiongate.gateway.api.openapi import openapi_document
from sessiongate.sdk import (
    AsyncSession,
    AsyncSessionGate,
    AuthenticationError,
    NotFoundError,
    PermissionDeniedError,
    SessionGate,
    Turn,
)

from .conftest import Gateway, running_gateway, served

pytestmark = pytest.mark.anyio

FAST = {"load_poll_interval_s": 0.02, "advisory_ttl_s": 10.0}
ADMIN, CLIENT = "admin-secret", "client-secret"
T = TypeVar("T")


async def eventually(read: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout_s: float = 5.0) -> T:
    deadline = time.monotonic() + timeout_s
    while not done(value := await read()):
        assert time.monotonic() < deadline, f"condition not reached in time: {value!r}"
        await asyncio.sleep(0.02)
    return value


@contextlib.asynccontextmanager
async def sdk_for(gw: Gateway) -> AsyncIterator[AsyncSessionGate]:
    transport = gw.client._transport  # the gateway app, served with its lifespan state
    async with AsyncSessionGate(
        base_url="http://gateway", api_key=CLIENT, admin_key=ADMIN, transport=transport, max_retries=0
    ) as client:
        yield client


async def _settled_turns(session: AsyncSession, count: int) -> list[Turn]:
    """The session's turns once the last one's advisory is settled (the gateway settles it after answering)."""
    return await eventually(session.turns, lambda turns: len(turns) == count and turns[-1].advisory is not None)


def _turn_schema_validator() -> jsonschema.Draft202012Validator:
    document = openapi_document()
    return jsonschema.Draft202012Validator({"$ref": "#/components/schemas/Turn", "components": document["components"]})


async def test_typing_then_a_turn_shows_the_used_advisory_on_the_turn(tmp_path: Path) -> None:
    async with (
        running_gateway(tmp_path, admin_key=ADMIN, api_key=CLIENT, **FAST) as gw,
        sdk_for(gw) as client,
    ):
        session = await client.sessions.create(session_id="hinted")
        await session.chat([{"role": "user", "content": "plan three days in Lisbon"}])

        hint = await session.typing("started")
        assert hint.state == "fired"
        assert hint.live
        assert hint.kind == "typing"
        assert hint.id is not None
        assert hint.worker is not None

        async def prefetched() -> bool:
            return any(p["state"] == "done" for w in gw.workers.values() for p in w.prefetches.values())

        await eventually(prefetched, bool)  # the user is still typing: the prefetch finishes meanwhile
        reply = await session.chat([{"role": "user", "content": "and what should I eat?"}])

        first, second = await _settled_turns(session, 2)
        assert first.advisory is None  # a session's first turn: nothing to foresee
        assert second.id == reply.turn_id
        assert second.advisory is not None
        assert (second.advisory.id, second.advisory.kind, second.advisory.outcome) == (hint.id, "typing", "used")
        assert second.advisory.target_worker == hint.worker == second.worker
        tiers = second.cached_tokens_by_tier
        assert tiers.device + tiers.host > 0  # the prefetched context was found on the worker
        assert second.usage is not None
        assert second.usage.cached_tokens == tiers.device + tiers.host + tiers.storage

        raw = (await gw.client.get("/v1/sessions/hinted/turns", headers={"authorization": f"Bearer {CLIENT}"})).json()
        validator = _turn_schema_validator()
        for turn in raw["data"]:
            validator.validate(turn)  # the documented shape is the served one
        assert raw["data"][1]["advisory"]["outcome"] == "used"
        assert raw["data"][1]["usage"]["cached_tokens_by_tier"] == {
            "device": tiers.device,
            "host": tiers.host,
            "storage": tiers.storage,
        }


async def test_a_turn_without_a_hint_is_missed_and_stopped_typing_is_answered(tmp_path: Path) -> None:
    async with (
        running_gateway(tmp_path, admin_key=ADMIN, api_key=CLIENT, **FAST) as gw,
        sdk_for(gw) as client,
    ):
        session = await client.sessions.create()
        assert (await session.typing("stopped")).state == "none"  # nothing live to stop
        await session.chat([{"role": "user", "content": "one"}])
        await session.chat([{"role": "user", "content": "two"}])
        _, second = await _settled_turns(session, 2)
        assert second.advisory is not None
        assert (second.advisory.kind, second.advisory.outcome, second.advisory.target_worker) == (
            "none",
            "missed",
            None,
        )

        explicit = await session.advise(expected_in_ms=0)
        assert (explicit.state, explicit.kind) == ("fired", "explicit")
        stopping = await session.typing("stopped")
        assert (stopping.state, stopping.id) == ("stopping", explicit.id)


async def test_tool_result_signal_after_a_tool_call(tmp_path: Path) -> None:
    tool = {
        "type": "function",
        "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}},
    }
    async with (
        running_gateway(tmp_path, admin_key=ADMIN, api_key=CLIENT, **FAST) as gw,
        sdk_for(gw) as client,
    ):
        session = await client.sessions.create()
        reply = await session.chat(
            [{"role": "user", "content": "add it"}],
            tools=[tool],
            tool_choice={"type": "function", "function": {"name": "add"}},
        )
        assert reply.message is not None
        (call,) = reply.message.tool_calls
        receipt = await session.tool_result(call.id, "42")
        assert (receipt.tool_call_id, receipt.name) == (call.id, "add")
        assert receipt.duration_ms is not None
        assert receipt.advisory is not None
        # The turn that ended with a tool call already made an advisory; the result refreshes it (or makes one).
        assert receipt.advisory.state in ("fired", "refreshed")
        assert receipt.advisory.live
        await session.chat([{"role": "tool", "tool_call_id": call.id, "content": "42"}], tools=[tool])
        _, second = await _settled_turns(session, 2)
        assert second.advisory is not None
        assert second.advisory.id == receipt.advisory.id
        assert second.advisory.kind in ("tool_call", "tool_result")
        assert second.advisory.outcome in ("used", "late")
        (recorded,) = (await session.turns())[0].tool_calls
        assert recorded.result == "42"

        with pytest.raises(NotFoundError):
            await session.tool_result("call_nobody_made", "0")


async def test_admin_client_sessions_kv_workers_and_stats(tmp_path: Path) -> None:
    async with (
        running_gateway(tmp_path, admin_key=ADMIN, api_key=CLIENT, **FAST) as gw,
        sdk_for(gw) as client,
    ):
        session = await client.sessions.create(session_id="ops-1")
        await session.chat([{"role": "user", "content": "remember the number 7"}])
        await session.chat([{"role": "user", "content": "what was it?"}])
        await _settled_turns(session, 2)

        page = await client.admin.sessions.list(tenant_id="default")
        assert [s.id for s in page.data] == ["ops-1"]
        shown = await client.admin.sessions.get("ops-1")
        assert [t.seq for t in shown.turns] == [1, 2]
        assert [a.outcome for a in shown.advisories] == ["missed"]
        assert shown.turns[1].advisory is not None
        assert shown.turns[1].advisory.id == shown.advisories[0].id
        assert sum(shown.kv["device"].values()) > 0  # believed resident where it ran

        assert (await client.admin.sessions.update("ops-1", priority=5)).priority == 5
        retained = await client.admin.sessions.retain_kv("ops-1", ttl_ms=60_000)
        assert retained.operation == "retain"
        assert {gw.name_of(w.worker) for w in retained.workers} == {"worker-a", "worker-b"}
        assert all(w.error is None for w in retained.workers)
        assert sum(w.tokens for w in retained.workers) > 0
        dropped = await client.admin.sessions.drop_kv("ops-1")
        assert dropped.operation == "drop"

        workers = await client.admin.workers.list()
        assert {gw.name_of(w.id) for w in workers} == {"worker-a", "worker-b"}
        target = workers[0].id
        drained = await client.admin.workers.drain(target)
        assert (drained.draining, drained.routable) == (True, False)
        for n in range(3):  # no new turn goes to a draining worker
            reply = await session.chat([{"role": "user", "content": f"again {n}"}])
            assert reply.worker != target
        assert (await client.admin.workers.undrain(target)).routable is True
        with pytest.raises(NotFoundError):
            await client.admin.workers.drain("no-such-worker:1")

        stats = await client.admin.advisory_stats()
        assert stats.missed >= 1
        assert stats.requests >= stats.missed

        closed = await client.admin.sessions.close("ops-1")
        assert closed.state == "closed"
        deleted = await client.admin.sessions.delete("ops-1")
        assert deleted.deleted
        with pytest.raises(NotFoundError):
            await client.admin.sessions.get("ops-1")

        transport = gw.client._transport
        async with AsyncSessionGate(base_url="http://gateway", api_key=CLIENT, transport=transport) as tenant:
            with pytest.raises(PermissionDeniedError):  # a tenant key is not an admin key
                await tenant.admin.workers.list()
        async with AsyncSessionGate(base_url="http://gateway", admin_key="wrong", transport=transport) as bad:
            with pytest.raises(AuthenticationError):
                await bad.admin.advisory_stats()


def _served(gw: Gateway) -> contextlib.AbstractAsyncContextManager[str]:
    """The same gateway app behind a real socket, for the synchronous client."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # the lifespan already runs in `running_gateway`
            return
        await gw.client._transport.app(scope, receive, send)

    return served(app, lifespan="off")


async def test_sync_client_signals_and_admin_over_real_http(tmp_path: Path) -> None:
    async with running_gateway(tmp_path, admin_key=ADMIN, api_key=CLIENT, **FAST) as gw, _served(gw) as url:

        def scenario() -> tuple[Turn, str | None]:
            with SessionGate(base_url=url, api_key=CLIENT, admin_key=ADMIN, max_retries=0) as client:
                session = client.sessions.create()
                session.chat([{"role": "user", "content": "hello"}])
                hint = session.advise(kind="typing", expected_in_ms=0)
                assert hint.state == "fired"
                time.sleep(0.3)  # the user types; the prefetch finishes meanwhile
                session.chat([{"role": "user", "content": "next"}])
                deadline = time.monotonic() + 5
                while (last := session.turns()[-1]).advisory is None:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                assert client.admin.sessions.get(session.id).turns[-1].advisory == last.advisory
                assert [w.routable for w in client.admin.workers.list()] == [True, True]
                return last, hint.id

        last, hint_id = await anyio.to_thread.run_sync(scenario)
        assert last.advisory is not None
        assert (last.advisory.id, last.advisory.kind, last.advisory.outcome) == (hint_id, "typing", "used")


def test_admin_requests_carry_the_admin_key_and_session_requests_the_tenant_key() -> None:
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.raw_path.decode(), request.headers.get("authorization")))
        if request.url.path.endswith("/stats"):
            return httpx.Response(200, json={"object": "advisory.stats", "requests": 0, "missed": 0, "kinds": {}})
        return httpx.Response(202, json={"object": "advisory", "state": "none"})

    with SessionGate(
        base_url="http://gw", api_key="tenant", admin_key="boss", transport=httpx.MockTransport(handler)
    ) as client:
        assert client.admin.advisory_stats().requests == 0
        assert client.sessions.typing("s/1", "stopped").state == "none"
    assert seen == [
        ("/v1/admin/advisories/stats", "Bearer boss"),
        ("/v1/sessions/s%2F1/typing", "Bearer tenant"),
    ]
