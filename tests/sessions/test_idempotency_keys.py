"""Idempotency keys in the store, on SQLite and PostgreSQL: a pending key is held by a gateway process; a retry takes
it over at once when that process's instance lease says it is dead, not while it lives (until the staleness bound);
a holder that lost its key writes nothing to it; keys past the retention are deleted."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from sessiongate.sessions import IdempotencyHolder, IdempotencyRecord, SqlSessionStore

from .conftest import CLOCK_START

pytestmark = pytest.mark.anyio

# The store stamps heartbeats with its test clock, a few ms after CLOCK_START: a lease bound a day before finds
# every lease renewed since (alive), one a day after finds none (all lapsed).
LONG_AGO = CLOCK_START - timedelta(days=1)
FUTURE = CLOCK_START + timedelta(days=1)
AT = CLOCK_START + timedelta(minutes=1)  # when the requests arrive

A = IdempotencyHolder(instance="replica-a", run="run-a1")
B = IdempotencyHolder(instance="replica-b", run="run-b1")
C = IdempotencyHolder(instance="replica-c", run="run-c1")


async def _lease(store: SqlSessionStore, holder: IdempotencyHolder) -> None:
    claimed = await store.claim_instance(
        holder.instance, run=holder.run, host="h1", pid=100, stale_before=LONG_AGO, holder_dead=lambda _: False
    )
    assert claimed is None


async def _claim(
    store: SqlSessionStore,
    holder: IdempotencyHolder,
    *,
    request_hash: str = "h",
    stale_before: datetime = LONG_AGO,
    holder_stale_before: datetime = LONG_AGO,
) -> IdempotencyRecord | None:
    return await store.claim_idempotency_key(
        tenant_id="default",
        key="k-1",
        request_hash=request_hash,
        holder=holder,
        now=AT,
        stale_before=stale_before,
        holder_stale_before=holder_stale_before,
    )


async def _turn_id(store: SqlSessionStore, content: str) -> str:
    turn = await store.begin_turn(
        "s-idem",
        tenant_id="default",
        create_session=True,
        messages=[{"role": "user", "content": content}],
        request={},
        received_at=AT,
    )
    return turn.id


async def test_a_live_holder_keeps_its_key_until_the_staleness_bound(store: SqlSessionStore) -> None:
    await _lease(store, A)
    await _lease(store, B)
    assert await _claim(store, A) is None
    held = await _claim(store, B)
    assert held is not None
    assert (held.status, held.holder) == ("pending", A)  # in progress: the retry is told to wait
    # The holder itself is alive, whatever its lease says: a duplicate racing its first request waits too.
    duplicate = await _claim(store, A, holder_stale_before=FUTURE)
    assert duplicate is not None
    assert duplicate.holder == A
    # Another request under the same key is never a takeover.
    other = await _claim(store, B, request_hash="other", stale_before=FUTURE, holder_stale_before=FUTURE)
    assert other is not None
    assert other.holder == A
    # Past the staleness bound (the read timeout) no turn can still be running: taken over, live holder or not.
    assert await _claim(store, B, stale_before=FUTURE) is None
    again = await _claim(store, A)
    assert again is not None
    assert again.holder == B


@pytest.mark.parametrize("ending", ["lapsed", "restarted", "released"])
async def test_a_dead_holders_key_is_taken_over_at_once(store: SqlSessionStore, ending: str) -> None:
    await _lease(store, A)
    await _lease(store, B)
    await _lease(store, C)
    assert await _claim(store, A) is None
    holder_stale_before = LONG_AGO
    if ending == "lapsed":  # no heartbeat since the bound: the process stopped renewing its lease
        holder_stale_before = FUTURE
    elif ending == "restarted":  # the instance came back as a new run: the old run is gone
        restarted = await store.claim_instance(
            A.instance, run="run-a2", host="h1", pid=101, stale_before=LONG_AGO, holder_dead=lambda _: True
        )
        assert restarted is None
    else:  # stopped, its lease released
        await store.release_instance(A.instance, run=A.run)
    # Long before the staleness bound (stale_before a day before the claim): the lease alone decides.
    assert await _claim(store, B, holder_stale_before=holder_stale_before) is None
    # The retry's gateway holds the key now, and it is alive: the next retry waits for it.
    waits = await _claim(store, C)
    assert waits is not None
    assert (waits.status, waits.holder) == ("pending", B)


async def test_of_two_retries_taking_over_a_dead_holders_key_one_wins(store: SqlSessionStore) -> None:
    for holder in (A, B, C):
        await _lease(store, holder)
    assert await _claim(store, A) is None
    await store.release_instance(A.instance, run=A.run)
    outcomes = await asyncio.gather(_claim(store, B), _claim(store, C))
    assert sum(outcome is None for outcome in outcomes) == 1
    winner = B if outcomes[0] is None else C
    after = await _claim(store, A)
    assert after is not None
    assert after.holder == winner


async def test_a_holder_that_lost_its_key_neither_completes_nor_releases_it(store: SqlSessionStore) -> None:
    await _lease(store, A)
    await _lease(store, B)
    assert await _claim(store, A) is None
    assert await _claim(store, B, holder_stale_before=FUTURE) is None  # A's lease lapsed: B took the key over
    late_turn, retry_turn = await _turn_id(store, "late"), await _turn_id(store, "retry")

    # A was only slow: its turn ends after all, but the key is B's.
    assert not await store.complete_idempotency_key(
        tenant_id="default", key="k-1", holder=A, turn_id=late_turn, response={"body": "late"}
    )
    await store.release_idempotency_key(tenant_id="default", key="k-1", holder=A)
    pending = await _claim(store, A)
    assert pending is not None
    assert (pending.status, pending.holder, pending.response) == ("pending", B, None)  # neither answered nor freed

    assert await store.complete_idempotency_key(
        tenant_id="default", key="k-1", holder=B, turn_id=retry_turn, response={"body": "retry"}
    )
    assert not await store.complete_idempotency_key(
        tenant_id="default", key="k-1", holder=A, turn_id=late_turn, response={"body": "late"}
    )
    done = await _claim(store, A)
    assert done is not None
    assert (done.status, done.turn_id, done.response) == ("done", retry_turn, {"body": "retry"})


async def test_a_failed_request_frees_its_key(store: SqlSessionStore) -> None:
    await _lease(store, A)
    await _lease(store, B)
    assert await _claim(store, A) is None
    await store.release_idempotency_key(tenant_id="default", key="k-1", holder=B)  # not B's: nothing happens
    assert await _claim(store, B) is not None
    await store.release_idempotency_key(tenant_id="default", key="k-1", holder=A)
    assert await _claim(store, B) is None


async def test_idempotency_keys_older_than_the_cutoff_are_deleted(store: SqlSessionStore) -> None:
    old, new = datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 1, 3, tzinfo=UTC)

    async def claim(key: str, at: datetime, stale_before: datetime) -> IdempotencyRecord | None:
        return await store.claim_idempotency_key(
            tenant_id="default",
            key=key,
            request_hash="h",
            holder=A,
            now=at,
            stale_before=stale_before,
            holder_stale_before=LONG_AGO,
        )

    await _lease(store, A)
    for key, at in (("old-pending", old), ("old-done", old), ("new-done", new)):
        assert await claim(key, at, at) is None
    await store.create_session(session_id="s-idem")
    for key in ("old-done", "new-done"):
        turn_id = await _turn_id(store, key)
        assert await store.complete_idempotency_key(
            tenant_id="default", key=key, holder=A, turn_id=turn_id, response={"body": {}}
        )

    assert await store.delete_idempotency_keys(created_before=datetime(2025, 1, 2, tzinfo=UTC)) == 2
    assert await store.delete_idempotency_keys(created_before=datetime(2025, 1, 2, tzinfo=UTC)) == 0
    # The young key still replays; the deleted ones can be claimed anew.
    kept = await claim("new-done", new, old)
    assert kept is not None
    assert kept.status == "done"
    for key in ("old-pending", "old-done"):
        assert await claim(key, new, old) is None
