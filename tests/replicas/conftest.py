"""Two gateway replicas (two `create_app` apps, each with its own lifespan) on one SQLite database, in front of the
same fake workers (benchmarks.fake_worker: SGLang's wire format and the extension's prefetch protocol), sharing
their state through a real Redis or each keeping its own (`LocalShared`).

Redis: `SESSIONGATE_TEST_REDIS_URL` (default redis://127.0.0.1:6379/0); every test gets its own key prefix and
deletes its keys afterwards. Without a Redis answering there the Redis cases skip, saying so, unless
`SESSIONGATE_REQUIRE_REDIS=1` (CI, after scripts/ensure-redis.sh): then they fail.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.gateway.state import GatewayState
from sessiongate.gateway.workers.pool import worker_id_for
from tests.conftest import WithLifespanState, fake_workers

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
WEBHOOK_SECRET = "replicas-webhook-secret"


def _redis_answers(url: str) -> str | None:
    """None when a Redis answers PING at `url`, else why not."""
    try:
        import redis
    except ImportError:
        return "redis-py is not installed (the `redis` extra)"
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"no Redis answers at {url}: {exc}"
    finally:
        client.close()
    return None


@pytest.fixture(scope="session")
def redis_server() -> str:
    url = os.environ.get("SESSIONGATE_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    reason = _redis_answers(url)
    if reason is not None:
        if os.environ.get("SESSIONGATE_REQUIRE_REDIS") == "1":
            pytest.fail(f"SESSIONGATE_REQUIRE_REDIS=1 but {reason} (run scripts/ensure-redis.sh)")
        pytest.skip(f"{reason.rstrip('.')}; start one (scripts/ensure-redis.sh) or set SESSIONGATE_TEST_REDIS_URL")
    return url


@dataclass(frozen=True)
class RedisSpace:
    url: str
    prefix: str


@pytest.fixture
def redis_space(redis_server: str) -> Iterator[RedisSpace]:
    """A key prefix of this test's own on the test Redis; its keys are deleted afterwards."""
    import redis

    prefix = f"sessiongate-test:{secrets.token_hex(6)}:"
    yield RedisSpace(redis_server, prefix)
    client = redis.Redis.from_url(redis_server)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(params=["local", "redis"])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The settings that choose how the replicas share state: none (LocalShared) or one Redis."""
    if request.param == "local":
        return {}
    space: RedisSpace = request.getfixturevalue("redis_space")
    return {"redis_url": space.url, "redis_prefix": space.prefix}


@dataclass
class Replica:
    name: str
    client: httpx.AsyncClient
    state: GatewayState


@dataclass
class Replicas:
    a: Replica
    b: Replica
    workers: dict[str, FakeWorkerBehaviour]
    # Each fake worker's worker id (`host:port`) by name ("worker-a", "worker-b").
    ids: dict[str, str]

    def name_of(self, worker_id: str) -> str:
        """The fake worker's name for a worker id."""
        return next(name for name, id_ in self.ids.items() if id_ == worker_id)

    @property
    def distributed(self) -> bool:
        return self.a.state.shared.distributed


@contextlib.asynccontextmanager
async def running_replicas(tmp_path: Path, **settings: Any) -> AsyncIterator[Replicas]:
    shared_pool: list[tuple[str, ...]] = []
    workers = {"worker-a": FakeWorkerBehaviour(pool=shared_pool), "worker-b": FakeWorkerBehaviour(pool=shared_pool)}
    async with contextlib.AsyncExitStack() as stack:
        urls = await stack.enter_async_context(fake_workers(workers))
        common: dict[str, Any] = {
            "workers": tuple(urls.values()),
            "database_url": f"sqlite+aiosqlite:///{tmp_path / 'replicas.db'}",
            "health_interval_s": 0.05,
            "load_poll_interval_s": 0.02,
            "allow_unauthenticated": True,
            # Replicas must share the salt secret, or each would send its own cache salt and share no KV.
            "cache_salt_secret": "replicas-salt",
            "webhook_secret": WEBHOOK_SECRET,
            **settings,
        }
        replicas = []
        for name in ("replica-a", "replica-b"):
            app = create_app(GatewaySettings(**common, instance_id=name))
            state = await stack.enter_async_context(app.router.lifespan_context(app))
            client = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=WithLifespanState(app, state)), base_url=f"http://{name}"
                )
            )
            replicas.append(Replica(name, client, state["gateway"]))
        ids = {name: worker_id_for(url) for name, url in urls.items()}
        yield Replicas(replicas[0], replicas[1], workers, ids)


@pytest.fixture
def make_replicas(tmp_path: Path, backend: dict[str, Any]) -> Callable[..., Any]:
    def make(**settings: Any) -> contextlib.AbstractAsyncContextManager[Replicas]:
        return running_replicas(tmp_path, **backend, **settings)

    return make
