"""The shared-state contract, run against both backends: LocalShared (in process) and RedisShared (a real Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sessiongate.gateway.shared import LocalShared, SharedAdvisory, SharedState

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["local", "redis"])
async def shared(request: pytest.FixtureRequest) -> AsyncIterator[SharedState]:
    if request.param == "local":
        yield LocalShared()
        return
    from sessiongate.gateway.shared.redis_shared import RedisShared

    space = request.getfixturevalue("redis_space")
    backend = RedisShared(space.url, prefix=space.prefix)
    try:
        yield backend
    finally:
        await backend.aclose()


def _advisory(expires_in_s: float, **fields: Any) -> SharedAdvisory:
    values: dict[str, Any] = {
        "id": "adv_1",
        "session_id": "s1",
        "tenant_id": "t",
        "kind": "typing",
        "worker_id": "worker-a:30000",
        "worker_url": "http://worker-a:30000",
        "target": "device",
        "owner": "replica-a/run",
        "expires_at": time.time() + expires_in_s,
        **fields,
    }
    return SharedAdvisory(**values)


async def test_one_turn_claims_an_advisory_and_its_owner_then_finds_it_gone(shared: SharedState) -> None:
    record = _advisory(30, fired=True, ready_at=time.time() - 1, bytes_loaded=4096)
    await shared.put_advisory(record, keep_s=60)
    turns = await asyncio.gather(*(shared.begin_turn("s1", time.time()) for _ in range(5)))
    claimed = [t.advisory for t in turns if t.advisory is not None]
    assert claimed == [record]  # exactly one of five concurrent turns, with every field as written
    assert await shared.end_advisory("s1", "adv_1", time.time()) == ("gone", None)


async def test_owner_ends_an_expired_advisory_unless_it_was_extended(shared: SharedState) -> None:
    await shared.put_advisory(_advisory(0.05), keep_s=60)
    await asyncio.sleep(0.1)
    assert (await shared.begin_turn("s1", time.time())).advisory is None  # expired: for its owner to settle
    state, record = await shared.end_advisory("s1", "adv_1", time.time())
    assert (state, record is not None) == ("ended", True)
    assert await shared.get_advisory("s1") is None

    await shared.put_advisory(_advisory(0.05, id="adv_2"), keep_s=60)
    later = time.time() + 30
    assert await shared.update_advisory("s1", "adv_2", 60, expires_at=later, stopped=True)
    assert not await shared.update_advisory("s1", "adv_other", 60, stopped=True)
    await asyncio.sleep(0.1)
    state, record = await shared.end_advisory("s1", "adv_2", time.time())
    assert state == "extended"
    assert record is not None
    assert record.stopped
    assert record.expires_at == pytest.approx(later)
    # Replaced by another advisory that nobody claimed: the first one's owner settles its own.
    await shared.put_advisory(_advisory(30, id="adv_3"), keep_s=60)
    assert await shared.end_advisory("s1", "adv_2", time.time()) == ("ended", None)


async def test_a_fire_request_marks_the_record_once_and_is_queued_for_its_owner(shared: SharedState) -> None:
    now = time.time()
    await shared.put_advisory(_advisory(10), keep_s=60)
    assert await shared.fire_requests("replica-a/run") == []
    asked = await shared.request_fire("s1", expires_at=now + 30, now=now, keep_s=60)
    assert asked is not None
    assert (asked.fire_requested_at, asked.expires_at, asked.fired_early) == (pytest.approx(now), now + 30, False)
    assert await shared.get_advisory("s1") == asked  # every replica reads the request in the record
    # Asked once: a second request (another tool result, another replica) changes nothing and queues nothing.
    assert await shared.request_fire("s1", expires_at=now + 60, now=now, keep_s=60) is None
    assert await shared.fire_requests("replica-b/run") == []
    assert await shared.fire_requests("replica-a/run") == [("s1", "adv_1")]
    assert await shared.fire_requests("replica-a/run") == []  # taken
    # The owner fires it, early: written with the fire, and no longer to be asked for.
    assert await shared.update_advisory("s1", "adv_1", 60, fired=True, fired_early=True)
    record = await shared.get_advisory("s1")
    assert record is not None
    assert (record.fired, record.fired_early, record.fire_requested_at) == (True, True, pytest.approx(now))
    # Fired already, expired, or none: nothing to ask for.
    await shared.put_advisory(_advisory(10, id="adv_2", fired=True), keep_s=60)
    assert await shared.request_fire("s1", expires_at=now + 30, now=now, keep_s=60) is None
    await shared.put_advisory(_advisory(10, id="adv_3"), keep_s=60)
    assert await shared.request_fire("s1", expires_at=now + 30, now=now + 20, keep_s=60) is None
    assert await shared.request_fire("none", expires_at=now + 30, now=now, keep_s=60) is None
    assert await shared.fire_requests("replica-a/run") == []


async def test_token_bucket_refills_by_the_minute_and_goes_below_zero(shared: SharedState) -> None:
    now = time.time()
    assert await shared.take_tokens("t", capacity=60, amount=0, now=now) == 60
    assert await shared.take_tokens("t", capacity=60, amount=90, now=now) == pytest.approx(-30)
    assert await shared.take_tokens("t", capacity=60, amount=0, now=now + 10) == pytest.approx(-20)
    assert await shared.take_tokens("t", capacity=60, amount=0, now=now + 600) == 60  # full, never more
    assert await shared.take_tokens("other", capacity=60, amount=1, now=now) == 59


async def test_set_if_absent_holds_a_key_for_its_ttl(shared: SharedState) -> None:
    assert await shared.set_if_absent("webhook:x", ttl_s=0.1)
    assert not await shared.set_if_absent("webhook:x", ttl_s=0.1)
    assert await shared.set_if_absent("webhook:y", ttl_s=0.1)
    await asyncio.sleep(0.15)
    assert await shared.set_if_absent("webhook:x", ttl_s=0.1)


async def test_samples_keep_the_latest_in_order_and_counters_add_up(shared: SharedState) -> None:
    for i in range(7):
        await shared.add_sample(["session:s", "kind:typing"], (1000.0 + i, i % 2 == 1), max_len=5, ttl_s=60)
    session, kind, empty = await shared.samples(["session:s", "kind:typing", "tenant:none"])
    assert session == kind == [(1002.0 + i, i % 2 == 1) for i in range(5)]
    assert empty == []
    await shared.incr("advisories", {"typing:used": 1, "lead_s": 0.5})
    await shared.incr("advisories", {"typing:used": 2, "lead_s": 0.25})
    assert await shared.counters("advisories") == {"typing:used": 3, "lead_s": 0.75}


async def test_kv_belief_round_trips_and_drops(shared: SharedState) -> None:
    from sessiongate.gateway.shared import SharedKV

    kv = SharedKV(
        workers={"worker-a:30000": (120, "device", 1000.5), "worker-b:30000": (80, "host", 990.0)},
        pool=120,
        last_worker="worker-a:30000",
        context_tokens=120,
        last_report={"device": 100, "storage_backend": "file"},
    )
    await shared.put_kv("s1", kv, ttl_s=60)
    assert (await shared.begin_turn("s1", time.time())).kv == kv
    await shared.drop_kv("s1")
    assert (await shared.begin_turn("s1", time.time())).kv is None
