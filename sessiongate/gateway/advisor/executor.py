"""The advisor's actions, performed: the book's changes, the store's records, the prefetches, statistics and logs.

`Executor.perform` carries out a `decide.Decision`'s actions in order and `reply` renders its answer; the other
methods are the advisor's effects outside a signal: settling an advisory (`settle`, `withdrawn`), firing its
prefetch (`fire`), the batched "missed" records, and the end of a shared advisory's copy here. A signal awaits
only its own writes (the new advisory's record, the shared state's copy); the rest of the I/O runs in background
tasks (`spawn`): nothing the chat path calls here awaits anything, and no advisor failure reaches a user's turn
(store and worker errors are logged and the advisory marked failed, which drops its reservation).
A stopping advisor lets the outcomes being written reach the store (`drain`) before it stops the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog

from sessiongate import sessions
from sessiongate.gateway.errors import UpstreamError, WorkerRejected
from sessiongate.gateway.routing import WorkerView
from sessiongate.gateway.routing.router import Router

from .core import AdvisorBook, LiveAdvisory
from .decide import (
    Action,
    CancelStale,
    CountSignal,
    Create,
    DropScheduled,
    FireDue,
    Ignore,
    RecordEarlyFire,
    Refresh,
    Reply,
    Retarget,
    ReturnedInRetain,
    ShareExpiry,
    Supersede,
)
from .prefetch import Prefetcher
from .quality import HintQuality
from .replicas import LocalAdvisories
from .stats import AdvisoryStats
from .tool_lifecycle import ToolLifecycle

__all__ = ["RECORDS_DRAIN_S", "Executor"]

log = structlog.get_logger(__name__)

# How long a stopping advisor waits for the outcomes it is writing to the store.
RECORDS_DRAIN_S = 5.0


class Executor:
    def __init__(
        self,
        *,
        store: sessions.SessionStore,
        router: Router,
        book: AdvisorBook,
        quality: HintQuality,
        stats: AdvisoryStats,
        replicas: LocalAdvisories,
        tools: ToolLifecycle,
        prefetcher: Prefetcher,
        clock: Callable[[], float],
        wall: Callable[[], datetime],
        missed_flush_s: float,
    ) -> None:
        self.store = store
        self.router = router
        self.book = book
        self.quality = quality
        self.stats = stats
        self.replicas = replicas
        self.tools = tools
        self.prefetcher = prefetcher
        self.clock = clock
        self.wall = wall
        self._tasks: set[asyncio.Task[None]] = set()
        self._records: set[asyncio.Task[None]] = set()
        # "Missed" records wait here and are written together, at most `missed_flush_s` after the first.
        self.missed_flush_s = missed_flush_s
        self._missed: list[sessions.MissedTurn] = []

    # background work

    def spawn(self, work: Coroutine[Any, Any, None], *, record: bool = False) -> None:
        """Run `work` in the background; a `record` (an outcome written to the store) is let finish at shutdown."""
        task = asyncio.get_running_loop().create_task(work)
        tasks = self._records if record else self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def drain(self) -> None:
        """The outcomes being written go in first (a settled advisory would otherwise stay pending in the store for
        good), for at most RECORDS_DRAIN_S; the missed records and shared counters are flushed; the prefetches and
        timers are only stopped."""
        if self._records:
            await asyncio.wait(list(self._records), timeout=RECORDS_DRAIN_S)
        await self.flush_missed()
        await self.replicas.flush_counts()
        tasks = [*self._tasks, *self._records]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # a signal's actions

    async def perform(self, actions: Sequence[Action], now: float) -> LiveAdvisory | None:
        """Carry out a decision's actions in order; returns the advisory a `Create` made (None: none)."""
        created = None
        for action in actions:
            match action:
                case CountSignal(kind):
                    self.stats.signal(kind)
                    self.replicas.count({f"{kind}:signals": 1})
                case CancelStale(advisory):
                    self.book.withdraw(advisory.session_id)
                    self.withdrawn(advisory, "cancelled")
                case DropScheduled(advisory):
                    # As a fire replaces it: withdrawn (settled cancelled, so no reservation), and the turn's
                    # routing counts its own load.
                    self.book.withdraw(advisory.session_id)
                    log.info(
                        "advisory_early_skipped", advisory_id=advisory.id, kind=advisory.kind, reason="cannot_land"
                    )
                    self.tools.skipped_early(advisory.session_id)
                    if await self.replicas.take_back(advisory):
                        self.withdrawn(advisory, "cancelled")
                case Refresh(advisory, fire_in_s):
                    self.book.refresh(advisory.session_id, now, fire_in_s=fire_in_s)
                case ShareExpiry(advisory):
                    await self.replicas.update(
                        advisory, expires_at=self.replicas.to_unix(advisory.expires_at, self.clock()), stopped=False
                    )
                case Retarget(advisory):
                    self.retarget(advisory)
                case FireDue():
                    for due in self.book.due(now):
                        self.spawn(self.fire(due))
                case RecordEarlyFire(advisory, signal_kind, requested_elsewhere):
                    # Before its fire task runs (`FireDue` only spawned it), which writes it to the shared state.
                    advisory.fired_early = True
                    log.info(
                        "advisory_fired_early",
                        advisory_id=advisory.id,
                        kind=advisory.kind,
                        signal=signal_kind,
                        requested_elsewhere=requested_elsewhere,
                    )
                    self.stats.tool_kv_event("early")
                case ReturnedInRetain(advisory):
                    self.tools.returned_in_retain(advisory)
                case Supersede(advisory, now_worker):
                    self.book.withdraw(advisory.session_id)
                    log.info(
                        "advisory_superseded", advisory_id=advisory.id, worker=advisory.worker_id, now_worker=now_worker
                    )
                    if await self.replicas.take_back(advisory):
                        self.withdrawn(advisory, "cancelled")
                case Ignore(session_id, kind, reason):
                    self._ignore(session_id, kind, reason)
                case Create():
                    created = await self._create(action, now)
        return created

    def _ignore(self, session_id: str, kind: str, reason: str) -> None:
        if reason == "cannot_land":
            self.tools.skipped_early(session_id)
        elif reason == "hints_mostly_wasted":
            self.stats.skipped(kind)
            self.replicas.count({f"{kind}:skipped": 1})
        else:
            return  # no routable worker: nothing to count
        log.info("advisory_skipped", reason=reason, kind=kind)

    async def _create(self, action: Create, now: float) -> LiveAdvisory:
        signal, worker = action.signal, action.worker
        wall = self.wall()
        detail: dict[str, Any] = {
            "target": action.tier,
            "expected_in_ms": None if action.expected_in_s is None else round(action.expected_in_s * 1000),
        }
        if signal.decision is not None:
            detail["tool_kv"] = signal.decision.detail()
        record = await self.store.create_advisory(
            signal.session_id,
            tenant_id=signal.tenant_id,
            kind=signal.kind,
            target_worker=worker.id,
            created_at=wall,
            expires_at=wall + timedelta(seconds=action.ttl_s),
            detail=detail,
        )
        advisory = LiveAdvisory(
            id=record.id,
            session_id=signal.session_id,
            tenant_id=signal.tenant_id,
            kind=signal.kind,
            worker_id=worker.id,
            worker_url=worker.url,
            target=action.tier,
            created_at=now,
            fire_at=now + action.fire_in_s,
            expires_at=now + action.ttl_s,
            expected_at=None if action.expected_in_s is None else now + action.expected_in_s,
        )
        if signal.decision is not None:
            self.tools.apply(signal.decision, advisory, now)
        self.book.add(advisory)
        to_fire = self.book.due(now)
        # Shared before its prefetch starts, so its updates find it.
        await self.replicas.put(advisory, self.replicas.to_unix(advisory.expires_at, self.clock()))
        for each in to_fire:
            self.spawn(self.fire(each))
        log.info("advisory_created", advisory_id=record.id, kind=signal.kind, worker=worker.id, target=action.tier)
        return advisory

    def reply(self, reply: Reply, created: LiveAdvisory | None, now: float) -> dict[str, Any]:
        """A decision's reply as the signal's HTTP answer."""
        if reply.state == "created":
            assert created is not None
            return self.answer(created, "fired" if created.fired else "scheduled", now)
        if reply.advisory is None:
            return {"object": "advisory", "state": reply.state, "reason": reply.reason}
        answer = self.answer(reply.advisory, reply.state, now)
        if reply.reason is not None:
            answer |= {"reason": reply.reason}
        if reply.expires_in_s is not None:
            answer |= {"expires_in_s": reply.expires_in_s}
        return answer

    @staticmethod
    def answer(advisory: LiveAdvisory, state: str, now: float) -> dict[str, Any]:
        return {
            "object": "advisory",
            "id": advisory.id,
            "state": state,
            "kind": advisory.kind,
            "worker": advisory.worker_id,
            "target": advisory.target,
            "expires_in_s": round(max(advisory.expires_at - now, 0.0), 3),
        }

    # routing

    def retarget(self, advisory: LiveAdvisory) -> None:
        """Point a not yet fired advisory at the worker the router would pick now."""
        worker = self.router.choose(advisory.session_id, advisory.tenant_id)
        if worker is not None and worker.id != advisory.worker_id:
            log.info("advisory_retargeted", advisory_id=advisory.id, worker=advisory.worker_id, now_worker=worker.id)
            advisory.worker_id, advisory.worker_url = worker.id, worker.url

    def home_worker(self, session_id: str) -> WorkerView | None:
        """The routable worker that served the session last (where its KV is), if any."""
        home = self.router.belief.residency(session_id, self.router.clock()).last_worker
        return next((w for w in self.router.candidates() if w.id == home), None)

    # prefetches and outcomes

    async def fire(self, advisory: LiveAdvisory) -> None:
        fired: dict[str, object] = {"fired": True, "fired_early": True} if advisory.fired_early else {"fired": True}
        if not await self.replicas.update(advisory, **fired):
            return  # a turn on another replica claimed it before it was due: nothing left to prefetch for
        try:
            await self.prefetcher.run(advisory, live=lambda: self.book.live.get(advisory.session_id) is advisory)
        except (UpstreamError, sessions.StoreError) as exc:
            advisory.failed = True
            await self.replicas.update(advisory, failed=True)
            unsupported = isinstance(exc, WorkerRejected) and exc.status_code == 404
            log.info("prefetch_failed", advisory_id=advisory.id, worker=advisory.worker_id, unsupported=unsupported)

    def withdrawn(self, advisory: LiveAdvisory, outcome: str) -> None:
        """An advisory left the book with no request: settle it, and cancel its prefetch (one still running stops,
        a finished one's pages stop ranking as a live hint's on that worker)."""
        self.settle(advisory, outcome, turn_id=None)
        self.end_prefetch(advisory)

    def end_prefetch(self, advisory: LiveAdvisory) -> None:
        """The advisory is over with no use on its worker: cancel its prefetch there."""
        if advisory.prefetch_id and advisory.worker_url:
            self.spawn(self.prefetcher.cancel(advisory))

    def settle(self, advisory: LiveAdvisory, outcome: str, *, turn_id: str | None, lead_s: float | None = None) -> None:
        self.quality.record(advisory.session_id, advisory.tenant_id, advisory.kind, outcome, self.clock())
        self.replicas.settled(advisory, outcome, lead_s, self.spawn)
        self.stats.settled(advisory.kind, outcome, lead_s=lead_s, bytes_loaded=advisory.bytes_loaded)
        log.info("advisory_settled", advisory_id=advisory.id, kind=advisory.kind, outcome=outcome)
        self.spawn(self._resolve(advisory.id, outcome, turn_id), record=True)

    async def _resolve(self, advisory_id: str, outcome: str, turn_id: str | None) -> None:
        try:
            await self.store.resolve_advisory(advisory_id, outcome=outcome, resolved_at=self.wall(), turn_id=turn_id)
        except sessions.StoreError as exc:
            log.warning("advisory_not_resolved", advisory_id=advisory_id, error=str(exc))

    # replicas

    async def end_shared(self, advisory: LiveAdvisory) -> None:
        """This replica's copy of a shared advisory expired: settle it unless a turn claimed it (anywhere) or a
        signal on another replica extended it."""
        outcome = await self.replicas.end_expired(self.book, advisory, self.clock())
        if outcome is not None:
            self.withdrawn(advisory, outcome)

    async def lapse_shared(self, advisory: LiveAdvisory) -> None:
        await self.replicas.update(advisory, fired=False, ready_at=None, failed=False)

    # missed turns

    def missed(self, session_id: str, tenant_id: str, turn_id: str) -> None:
        """A turn no advisory foresaw: counted, and recorded with the next batch."""
        self.stats.missed += 1
        self.replicas.count({"missed": 1})
        self._missed.append(sessions.MissedTurn(session_id, tenant_id, turn_id, self.wall()))
        if len(self._missed) == 1:
            self.spawn(self._flush_missed_later())

    async def _flush_missed_later(self) -> None:
        await asyncio.sleep(self.missed_flush_s)
        await self.flush_missed()

    async def flush_missed(self) -> None:
        """Write the waiting "missed" records in one store write (a turn's own writes come first; these are
        statistics, so a batch lost to a store outage is logged, not retried)."""
        batch, self._missed = self._missed, []
        if not batch:
            return
        try:
            await self.store.record_missed_turns(batch)
        except sessions.StoreError as exc:
            log.warning("advisory_not_recorded", outcome="missed", turns=len(batch), error=str(exc))
