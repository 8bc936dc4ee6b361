"""Fixtures for the security tests: the real gateway app on a real SQLite store, keys required, an admin key,
one fake worker speaking SGLang's HTTP API on a real localhost socket (benchmarks.fake_worker)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from tests.conftest import WithLifespanState, fake_workers

ADMIN_KEY = "admin-secret-for-tests"


@dataclass
class SecureGateway:
    client: httpx.AsyncClient
    worker: FakeWorkerBehaviour
    state: Any

    async def new_key(self, tenant: str) -> str:
        answer = await self.client.post("/v1/admin/keys", json={"tenant": tenant}, headers=admin())
        assert answer.status_code == 201, answer.text
        key: str = answer.json()["key"]
        return key


def admin() -> dict[str, str]:
    return {"authorization": f"Bearer {ADMIN_KEY}"}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@contextlib.asynccontextmanager
async def secure_gateway(tmp_path: Path, **settings: Any) -> AsyncIterator[SecureGateway]:
    behaviour = FakeWorkerBehaviour()
    async with fake_workers({"worker": behaviour}) as urls:
        options: dict[str, Any] = {
            "workers": (urls["worker"],),
            "database_url": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
            "health_interval_s": 0.05,
            "admin_key": ADMIN_KEY,
            # A test may run several of these on one store at once: each is a replica of its own (see the lease).
            "instance_id": f"test-{secrets.token_hex(4)}",
            **settings,
        }
        app = create_app(GatewaySettings(**options))
        async with app.router.lifespan_context(app) as state:
            served = WithLifespanState(app, state)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=served), base_url="http://gateway"
            ) as client:
                yield SecureGateway(client, behaviour, state["gateway"])


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[SecureGateway]:
    async with secure_gateway(tmp_path) as gw:
        yield gw


@pytest.fixture
def make_gateway(tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[SecureGateway]]:
    def make(**settings: Any) -> contextlib.AbstractAsyncContextManager[SecureGateway]:
        return secure_gateway(tmp_path, **settings)

    return make
