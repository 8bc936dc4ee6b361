"""The gateway's view of its SGLang workers: health, draining and requests in flight.

Health comes from two sources: a background loop that polls each worker's `GET /health`, and the requests
themselves (a worker that refuses a connection is marked down at once). A worker is routable after one good
check; one that fails `unhealthy_after` checks in a row leaves the routable set until its next good check. A check
that times out while the gateway has turns in flight on the worker does not count if the worker sent bytes of one
of them within `busy_grace_s` (5 s): it is busy. One that sends nothing while it cannot answer its health check
(SIGSTOPped, its host frozen: it still accepts connections, its kernel does) is not busy but half-open, and leaves.

Each check opens a new connection (`Connection: close`), so that a worker whose host or link is gone fails it at
the connect (refused, no route, or no answer to the handshake), which a busy worker never does: such a failure
counts even with turns in flight, and a worker taken out that way ends its turns in flight at once
(`abort_if_lost`: `WorkerUnreachable`, mid-stream or before the first byte), where they would otherwise wait out
the read timeout on a connection nobody will ever answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import structlog

from sessiongate.gateway.errors import WorkerUnreachable
from sessiongate.gateway.routing import WorkerView
from sessiongate.sglang_ext.protocol import LoadReport

__all__ = ["LostWatch", "Worker", "WorkerPool", "worker_id_for"]

log = structlog.get_logger(__name__)


def worker_id_for(url: str) -> str:
    """A stable, readable id for a worker URL: `host:port`."""
    parts = urlsplit(url)
    return parts.netloc or url


@dataclass(slots=True, eq=False)
class LostWatch:
    """A turn in flight on a worker (`WorkerPool.abort_if_lost`): its task is cancelled if the worker is lost."""

    task: asyncio.Task[Any]
    lost: bool = False


@dataclass(slots=True)
class Worker:
    """Mutable runtime state of one worker; owned by the pool, read through `WorkerView`s."""

    id: str
    url: str
    # Not routable until a health check has passed: the lifespan checks every worker before serving.
    healthy: bool = False
    draining: bool = False
    in_flight: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    served: int = 0
    models: tuple[str, ...] = field(default=())
    # The latest load report (sessiongate/gateway/workers/load.py), when it was received (monotonic seconds), and the
    # gateway's in-flight count at that moment; `extension` is False once the worker answered 404 (no sessiongate).
    load: LoadReport | None = None
    load_received_at: float = 0.0
    # When the worker last sent bytes of a turn (monotonic seconds; the relay sets it): a busy worker does.
    last_progress: float = 0.0
    in_flight_at_report: int = 0
    extension: bool | None = None
    watches: set[LostWatch] = field(default_factory=set)

    def view(self, *, now: float | None = None, stale_after_s: float = 2.0) -> WorkerView:
        """The policy's view; a load report older than `stale_after_s` is ignored (in-flight counts only)."""
        report = self.load
        if report is None or now is None or now - self.load_received_at > stale_after_s:
            return WorkerView(id=self.id, url=self.url, in_flight=self.in_flight)
        return WorkerView(
            id=self.id,
            url=self.url,
            in_flight=self.in_flight,
            running=report.running_requests,
            queued=report.queued_requests,
            in_flight_since_report=max(self.in_flight - self.in_flight_at_report, 0),
            prefill_tokens_per_s=report.prefill_tokens_per_s,
            decode_tokens_per_s=report.decode_tokens_per_s,
            active_prefill_tokens=report.queued_prefill_tokens,
            # SGLang's tokens in use: the pool less what is free or evictable, i.e. the running sequences' KV.
            active_kv_tokens=report.device_kv_tokens_used,
            device_kv_tokens=report.device_kv_tokens_total,
        )


class WorkerPool:
    def __init__(
        self,
        urls: tuple[str, ...],
        client: httpx.AsyncClient,
        *,
        health_timeout_s: float,
        unhealthy_after: int,
        busy_grace_s: float = 5.0,
    ) -> None:
        self._workers = {worker_id_for(u): Worker(id=worker_id_for(u), url=u.rstrip("/")) for u in urls}
        self._client = client
        self._timeout = health_timeout_s
        self._unhealthy_after = unhealthy_after
        self._busy_grace_s = busy_grace_s

    @property
    def workers(self) -> list[Worker]:
        return list(self._workers.values())

    def get(self, worker_id: str) -> Worker | None:
        return self._workers.get(worker_id)

    def routable(self, *, now: float | None = None, stale_after_s: float = 2.0) -> list[WorkerView]:
        return [
            w.view(now=now, stale_after_s=stale_after_s) for w in self._workers.values() if w.healthy and not w.draining
        ]

    @contextlib.contextmanager
    def lease(self, worker_id: str) -> Iterator[Worker]:
        """Count a request in flight on `worker_id` for the duration of the block."""
        worker = self._workers[worker_id]
        worker.in_flight += 1
        try:
            yield worker
        finally:
            worker.in_flight -= 1
            worker.served += 1

    @contextlib.contextmanager
    def abort_if_lost(self, worker_id: str, message: str) -> Iterator[None]:
        """Run the block (a turn's wait on the worker) until it ends or the worker is found unreachable by its health
        checks; then raise `WorkerUnreachable(message)` in it. Only the calling task is cancelled, by
        `Task.cancel` (no cancel scope or task group: this is on every turn's path)."""
        task = asyncio.current_task()
        assert task is not None
        watch = LostWatch(task)
        worker = self._workers[worker_id]
        worker.watches.add(watch)
        try:
            yield
        except asyncio.CancelledError:
            if not watch.lost:
                raise
            task.uncancel()
            raise WorkerUnreachable(message, worker=worker_id) from None
        finally:
            worker.watches.discard(watch)

    def _abort_in_flight(self, worker: Worker) -> None:
        for watch in list(worker.watches):
            if not watch.lost:
                watch.lost = True
                watch.task.cancel()
        if worker.watches:
            log.warning("worker_lost_turns_aborted", worker=worker.id, turns=len(worker.watches))

    def report_unreachable(self, worker_id: str, reason: str) -> None:
        """A request could not reach the worker: take it out now rather than at the next check."""
        worker = self._workers.get(worker_id)
        if worker is not None and worker.healthy:
            worker.healthy = False
            worker.consecutive_failures = self._unhealthy_after
            worker.last_error = reason
            log.warning("worker_down", worker=worker_id, reason=reason)

    async def check(self, worker: Worker) -> bool:
        unreachable = False
        try:
            response = await self._client.get(
                f"{worker.url}/health", timeout=self._timeout, headers={"connection": "close"}
            )
            ok = response.status_code == 200
            reason = None if ok else f"health answered {response.status_code}"
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # No connection at all: the host, its link or its server is gone. A busy worker still accepts.
            ok, reason, unreachable = False, f"{type(exc).__name__}: {exc}", True
        except httpx.TimeoutException as exc:
            if worker.healthy and worker.in_flight and time.monotonic() - worker.last_progress < self._busy_grace_s:
                # SGLang's /health runs a one-token generation behind the running batch and answers only when the
                # scheduler next reports: on a worker whose forward passes take seconds (long prefills on CPU) it
                # times out while the worker serves. Busy is not dead: a hung worker is caught by its turns'
                # timeouts, which take it out at once (`report_unreachable`). But a worker that sends nothing for any
                # of its turns either is not busy: it is hung or half-open, and leaves (its turns keep their timeout).
                log.debug("worker_busy", worker=worker.id, in_flight=worker.in_flight)
                return True
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        if ok:
            if not worker.healthy:
                log.info("worker_up", worker=worker.id, url=worker.url)
            worker.healthy, worker.consecutive_failures, worker.last_error = True, 0, None
        else:
            worker.consecutive_failures += 1
            worker.last_error = reason
            if worker.healthy and worker.consecutive_failures >= self._unhealthy_after:
                worker.healthy = False
                log.warning("worker_down", worker=worker.id, reason=reason)
            elif not worker.healthy and worker.consecutive_failures == 1:
                log.warning("worker_not_answering", worker=worker.id, url=worker.url, reason=reason)
            if unreachable and worker.consecutive_failures >= self._unhealthy_after:
                self._abort_in_flight(worker)
        return ok

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in self._workers.values()))

    async def run_health_checks(self, interval_s: float) -> None:
        """Poll every worker forever (after the lifespan's first round); cancelled at shutdown."""
        while True:
            await asyncio.sleep(interval_s)
            await self.check_all()
