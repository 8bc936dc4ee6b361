"""The gateway and a fake worker behind real sockets (uvicorn): what only a real HTTP server shows.

Chunked streaming with correct framing, chunks relayed as they come rather than buffered, and a client that
hangs up mid-stream being recorded as a cancelled turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.gateway.app import create_app
from sessiongate.gateway.server_protocol import HttpProtocol
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sglang_ext.ports import pick_port

from .conftest import served

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "one two three four five six seven eight nine ten"}


def _serve(app: Any, port: int | None = None) -> contextlib.AbstractAsyncContextManager[str]:
    # The server protocol `sessiongate serve` runs on (gateway.server_protocol), for the fake worker too.
    return served(app, port=port, http=HttpProtocol, lifespan="on")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[str, FakeWorkerBehaviour]]:
    behaviour = FakeWorkerBehaviour(token_delay_s=0.05)
    async with _serve(create_fake_worker(behaviour)) as worker_url:
        settings = GatewaySettings(
            allow_unauthenticated=True, workers=(worker_url,), database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
        )
        async with _serve(create_app(settings)) as gateway_url:
            yield gateway_url, behaviour


async def _turns(client: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    return list((await client.get(f"/v1/sessions/{session_id}/turns")).json()["data"])


async def test_stream_is_chunked_and_relayed_as_it_comes(stack: tuple[str, FakeWorkerBehaviour]) -> None:
    gateway_url, _ = stack
    async with httpx.AsyncClient(base_url=gateway_url, timeout=30) as client:
        started = time.perf_counter()
        arrivals: list[float] = []
        body = b""
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            headers={"X-Session-Id": "real-1"},
            json={"messages": [USER], "stream": True, "max_tokens": 11},
        ) as response:
            assert response.status_code == 200
            assert response.headers.get("transfer-encoding") == "chunked"
            assert "content-length" not in response.headers
            async for piece in response.aiter_bytes():
                arrivals.append(time.perf_counter() - started)
                body += piece
        assert body.endswith(b"data: [DONE]\n\n")
        # The worker spends 50 ms per token: a relay that buffered would deliver everything at the end.
        assert len(arrivals) > 5
        assert arrivals[0] < arrivals[-1] / 2
        (turn,) = await _turns(client, "real-1")
        assert turn["status"] == "ok"


async def test_client_hanging_up_mid_stream_is_recorded_as_cancelled(stack: tuple[str, FakeWorkerBehaviour]) -> None:
    gateway_url, behaviour = stack
    behaviour.token_delay_s = 0.2
    async with httpx.AsyncClient(base_url=gateway_url, timeout=30) as client:
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            headers={"X-Session-Id": "real-2"},
            json={"messages": [USER], "stream": True, "max_tokens": 11},
        ) as response:
            async for line in response.aiter_lines():
                if '"content":"echo:"' in line:
                    break  # leaving the block closes the connection mid-stream
        for _ in range(100):
            turns = await _turns(client, "real-2")
            if turns and turns[0]["status"] != "pending":
                break
            await asyncio.sleep(0.05)
        (turn,) = turns
        assert turn["status"] == "cancelled"
        assert turn["input_messages"] == [USER]
        assert turn["error"]["message"] == "the client disconnected"


async def test_worker_that_stops_answering_gives_502_and_leaves_the_pool(tmp_path: Path) -> None:
    worker_port = pick_port()
    settings = GatewaySettings(
        allow_unauthenticated=True,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        health_interval_s=3600,
        workers=(f"http://127.0.0.1:{worker_port}",),
    )
    async with contextlib.AsyncExitStack() as stack:
        worker = _serve(create_fake_worker(FakeWorkerBehaviour()), port=worker_port)
        await worker.__aenter__()
        gateway_url = await stack.enter_async_context(_serve(create_app(settings)))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=gateway_url, timeout=30))
        assert (await client.get("/readyz")).status_code == 200
        await worker.__aexit__(None, None, None)  # the worker goes away: connections are refused from now on

        response = await client.post(
            "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "gone"}
        )
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "worker_unreachable"
        (turn,) = await _turns(client, "gone")
        assert turn["status"] == "failed"
        assert turn["input_messages"] == [USER]
        # It left the pool at once: the next turn is refused without trying it, and the gateway is not ready.
        again = await client.post("/v1/chat/completions", json={"messages": [USER]})
        assert again.json()["error"]["code"] == "no_healthy_worker"
        assert (await client.get("/readyz")).status_code == 503


async def test_worker_down_at_start_is_not_routable(tmp_path: Path) -> None:
    settings = GatewaySettings(
        allow_unauthenticated=True,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        workers=(f"http://127.0.0.1:{pick_port()}",),
    )
    async with _serve(create_app(settings)) as gateway_url, httpx.AsyncClient(base_url=gateway_url) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        response = await client.post("/v1/chat/completions", json={"messages": [USER]})
        assert response.status_code == 503


async def test_a_stream_cut_short_is_charged_to_the_tenant(tmp_path: Path) -> None:
    """A client that hangs up before the usage chunk still pays for what the worker did: with a budget of 10
    tokens a minute, the cancelled turn (a prompt of ~18 estimated tokens plus the relayed chunk) spends it
    all, so the next request is refused."""
    behaviour = FakeWorkerBehaviour(token_delay_s=0.2)
    async with _serve(create_fake_worker(behaviour)) as worker_url:
        settings = GatewaySettings(
            allow_unauthenticated=True,
            workers=(worker_url,),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
            tenant_tokens_per_minute=10,
        )
        async with _serve(create_app(settings)) as gateway_url, httpx.AsyncClient(base_url=gateway_url) as client:
            async with client.stream(
                "POST",
                "/v1/chat/completions",
                headers={"X-Session-Id": "cut"},
                json={"messages": [USER], "stream": True, "max_tokens": 11},
            ) as response:
                async for line in response.aiter_lines():
                    if '"content":"echo:"' in line:
                        break
            for _ in range(100):
                turns = await _turns(client, "cut")
                if turns and turns[0]["status"] != "pending":
                    break
                await asyncio.sleep(0.05)
            assert turns[0]["status"] == "cancelled"
            refused = await client.post("/v1/chat/completions", json={"messages": [USER]})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "tokens_per_minute_exceeded"


@pytest.mark.parametrize("stream", [False, True])
async def test_the_workers_key_goes_with_every_turn(tmp_path: Path, stream: bool) -> None:
    """Turns go over the hot path's own HTTP session, not the control client: both must carry the key."""
    behaviour = FakeWorkerBehaviour(api_key="wk-secret")
    async with _serve(create_fake_worker(behaviour)) as worker_url:
        body = {"messages": [USER], "stream": stream, "max_tokens": 3}
        keyed = GatewaySettings(
            allow_unauthenticated=True,
            workers=(worker_url,),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'keyed.db'}",
            worker_api_key="wk-secret",
        )
        async with _serve(create_app(keyed)) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
            answer = await client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "keyed"})
            assert answer.status_code == 200, answer.text
            assert len(behaviour.requests) == 1
        unkeyed = GatewaySettings(
            allow_unauthenticated=True,
            workers=(worker_url,),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'unkeyed.db'}",
        )
        async with _serve(create_app(unkeyed)) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
            refused = await client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "unkeyed"})
            assert refused.status_code == 401, refused.text  # no key configured: the worker refuses the turn
            assert len(behaviour.requests) == 1
