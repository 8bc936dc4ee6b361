"""Two live gateways configured with one instance id would fail each other's in-flight turns at start-up: the
id is leased in the store, and a second live holder refuses to start with a clear error. A holder that stopped
renewing (crashed on another host) is taken over once its lease runs out; a clean stop frees the id at once."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from socket import gethostname

import anyio
import pytest

from sessiongate import sessions
from sessiongate.gateway.app import DuplicateInstance, create_app, default_instance_id
from sessiongate.gateway.settings import GatewaySettings

pytestmark = pytest.mark.anyio

LEASE_S = 0.6


def _settings(tmp_path: Path) -> GatewaySettings:
    return GatewaySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
        instance_id="replica-a",
        instance_lease_s=LEASE_S,
        allow_unauthenticated=True,
    )


async def test_a_second_live_gateway_with_the_same_id_refuses_to_start(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    first = create_app(settings)
    async with first.router.lifespan_context(first):
        second = create_app(settings)
        with pytest.raises(DuplicateInstance, match=r"instance id 'replica-a'.*SESSIONGATE_INSTANCE_ID"):
            async with second.router.lifespan_context(second):
                pytest.fail("a second gateway with the same instance id started")
    started = time.monotonic()
    third = create_app(settings)
    async with third.router.lifespan_context(third):
        pass
    assert time.monotonic() - started < LEASE_S  # the first released its lease when it stopped: no wait


async def test_a_crashed_holder_elsewhere_is_taken_over_after_its_lease(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    await sessions.upgrade(settings.database_url)
    store = sessions.SqlSessionStore(sessions.create_engine(settings.database_url))
    try:
        held = await store.claim_instance(
            "replica-a",
            run="crashed-run",
            host="another-host",
            pid=1,
            stale_before=datetime.now(UTC),
            holder_dead=lambda holder: False,
        )
        assert held is None
    finally:
        await store.close()
    started = time.monotonic()
    app = create_app(settings)
    with anyio.fail_after(30):
        async with app.router.lifespan_context(app):
            pass
    assert time.monotonic() - started >= LEASE_S  # it waited for the lease to run out, then took the id


def test_replicas_sharing_a_host_name_get_distinct_default_ids() -> None:
    """Replicas in network namespaces or containers of one machine share its host name and may share a port: bound to
    their own addresses, their default ids differ (tests/faults/test_cluster_netns.py runs two such replicas)."""
    assert default_instance_id("198.19.1.10", 8000) != default_instance_id("198.19.1.11", 8000)
    assert default_instance_id("198.19.1.10", 8000) == f"{gethostname()}:198.19.1.10:8000"
    for local in ("127.0.0.1", "0.0.0.0", "::", "localhost", ""):
        assert default_instance_id(local, 8000) == f"{gethostname()}:8000"  # as before: restarts keep their id
