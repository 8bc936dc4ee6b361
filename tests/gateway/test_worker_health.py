"""The health loop's verdicts: a worker that does not answer `/health` leaves the routable set after
`unhealthy_after` checks, unless it has turns in flight: SGLang answers `/health` only once its scheduler reports
again, so a worker deep in long prefills times out the check while serving."""

from __future__ import annotations

import time

import anyio
import anyio.lowlevel
import httpx
import pytest

from sessiongate.gateway.errors import WorkerUnreachable
from sessiongate.gateway.workers.pool import WorkerPool, worker_id_for

pytestmark = pytest.mark.anyio

URL = "http://worker-a:30000"


def _pool(answer: str) -> tuple[WorkerPool, httpx.AsyncClient]:
    async def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/health"
        if answer == "timeout":
            raise httpx.ReadTimeout("no answer within the timeout", request=request)
        if answer == "refused":
            raise httpx.ConnectError("connection refused", request=request)
        if answer == "no-handshake":  # the host or its link gone: the SYN is never answered
            raise httpx.ConnectTimeout("timed out", request=request)
        assert request.headers["connection"] == "close"  # a new connection each time: a cut link fails the connect
        return httpx.Response(200)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return WorkerPool((URL,), client, health_timeout_s=0.1, unhealthy_after=2), client


async def _checks(pool: WorkerPool, n: int) -> list[bool]:
    worker = pool.get(worker_id_for(URL))
    assert worker is not None
    return [await pool.check(worker) for _ in range(n)]


async def test_a_worker_is_routable_after_one_good_check() -> None:
    pool, client = _pool("ok")
    assert pool.routable() == []
    assert await _checks(pool, 1) == [True]
    assert [w.id for w in pool.routable()] == [worker_id_for(URL)]
    await client.aclose()


async def test_an_idle_worker_that_times_out_leaves_after_two_checks() -> None:
    pool, client = _pool("timeout")
    worker = pool.get(worker_id_for(URL))
    assert worker is not None
    worker.healthy = True
    assert await _checks(pool, 1) == [False]
    assert [w.id for w in pool.routable()] == [worker.id]  # one failed check is not enough
    assert await _checks(pool, 1) == [False]
    assert pool.routable() == []
    await client.aclose()


async def test_a_worker_serving_turns_that_times_out_stays_routable() -> None:
    pool, client = _pool("timeout")
    worker = pool.get(worker_id_for(URL))
    assert worker is not None
    worker.healthy = True
    with pool.lease(worker.id):
        worker.last_progress = time.monotonic()  # its turns' bytes are arriving: busy
        assert await _checks(pool, 3) == [True, True, True]
        assert [w.id for w in pool.routable()] == [worker.id]
    assert await _checks(pool, 2) == [False, False]  # its turns are done and it still does not answer
    assert pool.routable() == []
    await client.aclose()


async def test_a_refused_connection_counts_even_with_turns_in_flight() -> None:
    pool, client = _pool("refused")
    worker = pool.get(worker_id_for(URL))
    assert worker is not None
    worker.healthy = True
    with pool.lease(worker.id):
        assert await _checks(pool, 2) == [False, False]
    assert pool.routable() == []
    await client.aclose()


async def test_an_unreachable_worker_ends_its_turns_in_flight_at_once() -> None:
    """A connect that fails (its link cut: no answer to the handshake) is not a busy worker: it counts with turns in
    flight, and taking the worker out ends those turns with `WorkerUnreachable` instead of the read timeout."""
    pool, client = _pool("no-handshake")
    worker = pool.get(worker_id_for(URL))
    assert worker is not None
    worker.healthy = True
    outcome: list[str] = []
    ended = anyio.Event()

    async def turn() -> None:
        with pool.lease(worker.id):
            try:
                with pool.abort_if_lost(worker.id, "lost mid-stream"):
                    await anyio.sleep(30)  # a stream nobody will answer
            except WorkerUnreachable as exc:
                outcome.append(exc.message)
        ended.set()

    async with anyio.create_task_group() as group:
        group.start_soon(turn)
        await anyio.lowlevel.checkpoint()
        with anyio.fail_after(5):
            assert await _checks(pool, 2) == [False, False]
            await ended.wait()
    assert outcome == ["lost mid-stream"]
    assert pool.routable() == []
    assert worker.watches == set()
    await client.aclose()


async def test_a_busy_worker_keeps_its_turns() -> None:
    pool, client = _pool("timeout")
    worker = pool.get(worker_id_for(URL))
    assert worker is not None
    worker.healthy = True
    with pool.lease(worker.id), pool.abort_if_lost(worker.id, "lost"):
        worker.last_progress = time.monotonic()
        assert await _checks(pool, 3) == [True, True, True]
        assert [watch.lost for watch in worker.watches] == [False]
    await client.aclose()


async def test_a_half_open_worker_with_turns_in_flight_leaves() -> None:
    """It accepts connections (its kernel does) but sends nothing, for its health checks or its turns (SIGSTOP): not
    busy but hung. It leaves routing; its turns keep their read timeout (they are not aborted: it may come back)."""
    pool, client = _pool("timeout")
    worker = pool.get(worker_id_for(URL))
    assert worker is not None
    worker.healthy = True
    worker.last_progress = time.monotonic() - 10  # its last bytes, 10 s ago (busy_grace_s is 5)
    with pool.lease(worker.id), pool.abort_if_lost(worker.id, "lost"):
        assert await _checks(pool, 2) == [False, False]
        assert pool.routable() == []
        assert [watch.lost for watch in worker.watches] == [False]
    await client.aclose()
