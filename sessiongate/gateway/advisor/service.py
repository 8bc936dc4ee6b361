"""The advisor: turns signals into advisory prefetches, and settles each advisory's outcome in the store.

On a signal it picks the worker the router would pick now, leaves a reservation, and asks that worker to
prefetch the session's context (`store.session_context` plus the tools of the last turn, with the session's
priority and a ttl). The bookkeeping is `AdvisorBook` (pure); this class adds the I/O, all of it in background
tasks: nothing the chat path calls here awaits anything, and no advisor failure reaches a user's turn (store
and worker errors are logged and the advisory is marked failed, which drops its reservation).

With replicas (`gateway.shared`, distributed) each live advisory is also in the shared state. The replica that
made it (its owner) runs its prefetch and writes there when it fired, finished or failed; before each turn the
serving replica claims the session's advisory from there (`prepare_turn`: one atomic claim, so one turn on one
replica gets it) and settles it after the turn, as if it had made it. A signal on a replica that does not hold
the session's live advisory refreshes or stops the shared one; when the owner's copy expires it asks the shared
state whether it ended, was extended, or was claimed (then the claimer settled it). Hint quality outcomes go to
shared lists as well, so the adaptive rule judges a session, tenant or kind by every replica's outcomes. A shared
state that does not answer leaves each replica with its own book, as with one replica.

Three parts live apart, owned by the advisor: the calls to the shared state (`replicas.SharedAdvisories`), the
tool-call KV lifecycle's learnt state and its retain (`tool_lifecycle.ToolLifecycle`), and each advisory's
prefetch, from the store to the worker (`prefetch.Prefetcher`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from sessiongate import sessions
from sessiongate.gateway.errors import UpstreamError, WorkerRejected
from sessiongate.gateway.extension import ExtensionClient
from sessiongate.gateway.router import Router
from sessiongate.gateway.routing import Reservation, WorkerView
from sessiongate.gateway.shared import SharedState
from sessiongate.gateway.tracing import NO_TRACING, Tracing

from .core import AdvisorBook, Claim, LiveAdvisory, settle
from .prefetch import Prefetcher
from .quality import HintQuality, Tier
from .replicas import SharedAdvisories
from .stats import AdvisoryStats
from .tool_lifecycle import ToolLifecycle
from .toolkv import ResultGaps, ToolDurations, ToolKVDecision, ToolKVPolicy

__all__ = ["Advisor"]

log = structlog.get_logger(__name__)


# How long a stopping advisor waits for the outcomes it is writing to the store.
RECORDS_DRAIN_S = 5.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Advisor:
    def __init__(
        self,
        *,
        store: sessions.SessionStore,
        router: Router,
        extension: ExtensionClient,
        ttl_s: float = 30.0,
        stop_grace_s: float = 3.0,
        lead_s: float = 1.0,
        tool_result_trigger: str = "last",
        poll_interval_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utcnow,
        cache_salt_for: Callable[[str], str] | None = None,
        missed_flush_s: float = 0.25,
        shared: SharedState | None = None,
        replica: str = "",
        unix: Callable[[], float] = time.time,
        tool_kv: ToolKVPolicy | None = None,
        tool_kv_enabled: bool = True,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self.store = store
        self.router = router
        self.book = AdvisorBook(ttl_s=ttl_s, stop_grace_s=stop_grace_s)
        self.quality = HintQuality()
        self.stats = AdvisoryStats()
        # The tool-call KV lifecycle: its plans, what it learns between a tool call and the next turn, the retain.
        self.tools = ToolLifecycle(
            policy=tool_kv or ToolKVPolicy(), stats=self.stats, extension=extension, cache_salt_for=cache_salt_for
        )
        self.tool_kv_enabled = tool_kv_enabled
        self.lead_s = lead_s
        self.tool_result_trigger = tool_result_trigger
        self.clock = clock
        self.wall = wall
        self._claims: dict[str, Claim] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._records: set[asyncio.Task[None]] = set()
        # "Missed" records wait here and are written together, at most `missed_flush_s` after the first.
        self.missed_flush_s = missed_flush_s
        self._missed: list[sessions.MissedTurn] = []
        # One signal at a time per session (see `signal`): the lock, and how many signals hold or await it.
        self._signal_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # The replicas' shared state (None with one process: `shared` is what the chat path checks), and Unix time.
        self.replicas = SharedAdvisories(shared, replica=replica, unix=unix, quality=self.quality)
        self.shared = self.replicas.state
        self.unix = unix
        self.prefetcher = Prefetcher(
            store=store,
            extension=extension,
            router=router,
            stats=self.stats,
            replicas=self.replicas,
            tools=self.tools,
            cache_salt_for=cache_salt_for,
            poll_interval_s=poll_interval_s,
            clock=lambda: self.clock(),  # read through the advisor: tests swap its clock
            unix=unix,
            tracing=tracing,
        )

    # The lifecycle's learnt state, as the advisor's attributes (where tests seed it).

    @property
    def tool_durations(self) -> ToolDurations:
        return self.tools.durations

    @property
    def result_gaps(self) -> ResultGaps:
        return self.tools.result_gaps

    @result_gaps.setter
    def result_gaps(self, gaps: ResultGaps) -> None:
        self.tools.result_gaps = gaps

    # background work

    def _spawn(self, work: Coroutine[Any, Any, None], *, record: bool = False) -> None:
        """Run `work` in the background; a `record` (an outcome written to the store) is let finish at shutdown."""
        task = asyncio.get_running_loop().create_task(work)
        tasks = self._records if record else self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def aclose(self) -> None:
        # The outcomes being written go in first (a settled advisory would otherwise stay pending in the store
        # for good), for at most RECORDS_DRAIN_S; prefetches and timers are only stopped.
        if self._records:
            await asyncio.wait(list(self._records), timeout=RECORDS_DRAIN_S)
        await self.flush_missed()
        await self.replicas.flush_counts()
        tasks = [*self._tasks, *self._records]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run(self, interval_s: float = 0.05) -> None:
        """Fire scheduled advisories and settle expired ones, forever; cancelled at shutdown."""
        while True:
            self.tick()
            await asyncio.sleep(interval_s)

    def tick(self) -> None:
        if self.replicas.unflushed:
            self._spawn(self.replicas.flush_counts())
        now = self.clock()
        for advisory in self.book.lapse(now):
            # A keep_then_offload's retain lapsed: the KV is unprotected; its prefetch waits for the long kind.
            self.stats.tool_kv_event("retain_lapsed")
            if advisory.shared:
                self._spawn(self._lapse_shared(advisory))
        for advisory in self.book.due(now):
            if advisory.fire_at > advisory.created_at:
                self._retarget(advisory)  # scheduled for later: the router's choice may have changed since
            self._spawn(self._fire(advisory))
        for advisory in self.book.expire(now):
            if advisory.shared:
                self._spawn(self._end_shared(advisory))
            else:
                self._withdrawn(advisory, "cancelled" if advisory.stopped else "wasted")

    async def _lapse_shared(self, advisory: LiveAdvisory) -> None:
        await self.replicas.update(advisory, fired=False, ready_at=None, failed=False)

    def _home_worker(self, session_id: str) -> WorkerView | None:
        """The routable worker that served the session last (where its KV is), if any."""
        home = self.router.belief.residency(session_id, self.router.clock()).last_worker
        return next((w for w in self.router.candidates() if w.id == home), None)

    def _retarget(self, advisory: LiveAdvisory) -> None:
        """Point a not yet fired advisory at the worker the router would pick now."""
        worker = self.router.choose(advisory.session_id, advisory.tenant_id)
        if worker is not None and worker.id != advisory.worker_id:
            log.info("advisory_retargeted", advisory_id=advisory.id, worker=advisory.worker_id, now_worker=worker.id)
            advisory.worker_id, advisory.worker_url = worker.id, worker.url

    def _withdrawn(self, advisory: LiveAdvisory, outcome: str) -> None:
        """An advisory left the book with no request: settle it, and stop its prefetch if still running."""
        self._settle(advisory, outcome, turn_id=None)
        if advisory.prefetch_id and advisory.worker_url and advisory.ready_at is None:
            self._spawn(self.prefetcher.cancel(advisory))

    # signals

    def reservation(self, session_id: str) -> Reservation | None:
        return self.book.reservation(session_id, self.clock())

    async def signal(
        self,
        session_id: str,
        tenant_id: str,
        kind: str,
        *,
        expected_in_s: float | None = None,
        decision: ToolKVDecision | None = None,
    ) -> dict[str, Any]:
        """Handle one signal; returns what was done, for the signal's HTTP answer.

        Signals of one session are handled one at a time: handling reads the book, awaits the store, then writes
        the book, so two at once would each find no live advisory, each create one and fire its prefetch, and
        the first, overwritten in the book, would stay `pending` forever. The second now finds the first live
        and refreshes (or supersedes) it. This lock is per process. With replicas sharing state, a signal on a
        replica finds another replica's live advisory there and refreshes it; two signals at the same instant on
        two replicas may still make two advisories (two prefetches), the later one replacing the earlier in the
        shared state, whose owner then settles it (wasted) when its copy expires: none is left pending.
        """
        lock, users = self._signal_locks.get(session_id) or (asyncio.Lock(), 0)
        self._signal_locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                return await self._signal(session_id, tenant_id, kind, expected_in_s, decision)
        finally:
            lock, users = self._signal_locks[session_id]
            if users == 1:
                del self._signal_locks[session_id]
            else:
                self._signal_locks[session_id] = (lock, users - 1)

    async def _signal(
        self,
        session_id: str,
        tenant_id: str,
        kind: str,
        expected_in_s: float | None,
        decision: ToolKVDecision | None = None,
    ) -> dict[str, Any]:
        self.stats.signal(kind)
        self.replicas.count({f"{kind}:signals": 1})
        now = self.clock()
        if decision is not None:
            expected_in_s = decision.predicted_s
            # keep_then_offload: the retain now, its prefetch when the retain lapses (`AdvisorBook.lapse`).
            fire_in_s = 0.0 if decision.action == "keep_then_offload" else decision.fire_in_s
        else:
            fire_in_s = max((expected_in_s or 0.0) - self.lead_s, 0.0)
        worker: WorkerView | None = None
        live = self.book.get(session_id, now)
        if live is not None and decision is not None:
            # The turn that just ended claimed its own advisory: a live one now is a stale hint's, and the tool
            # call's decision (what holds the KV, when it comes back) supersedes it.
            self.book.withdraw(session_id)
            self._withdrawn(live, "cancelled")
            live = None
        # A tool result of a tenant whose next turns follow their results too closely for a prefetch to land (the
        # SDK's flow: post the result, send the turn) starts no prefetch: it would only compete with that turn.
        lands = kind != "tool_result" or self.tools.early_fire_lands(
            tenant_id, self.router.belief.context_tokens(session_id)
        )
        if live is not None and not live.fired:
            # A scheduled advisory (a long tool's prefetch) meets a new signal: a tool result before the predicted
            # return fires it now, at the worker the router picks now (unless it cannot land).
            if not lands and now + fire_in_s < live.fire_at:
                return await self._skip_early(live, now)
            self.book.refresh(session_id, now, fire_in_s=fire_in_s)
            if live.fire_at > now:
                return self._answer(live, "refreshed", now)
            self._retarget(live)
            for due in self.book.due(now):
                self._spawn(self._fire(due))
            log.info("advisory_fired_early", advisory_id=live.id, kind=live.kind, signal=kind)
            self.stats.tool_kv_event("early")
            return self._answer(live, "fired", now)
        if live is not None:
            if kind == "tool_result":
                self.tools.returned_in_retain(live)
            # Where would the request go now? The live advisory's worker is offered as a reservation, so a policy
            # that honours reservations keeps it while it is still a good choice (no thrashing between equals).
            keep = None if live.failed else Reservation(worker_id=live.worker_id, expires_at=live.expires_at)
            worker = self.router.choose(session_id, tenant_id, reservation=keep)
            if worker is None or worker.id == live.worker_id or not lands:
                self.book.refresh(session_id, now, fire_in_s=fire_in_s)
                await self.replicas.update(live, expires_at=self._to_unix(live.expires_at), stopped=False)
                return self._answer(live, "refreshed", now)
            # The load moved since the advisory was made: the request would not go to its worker any more.
            self.book.withdraw(session_id)
            log.info("advisory_superseded", advisory_id=live.id, worker=live.worker_id, now_worker=worker.id)
            if await self.replicas.take_back(live):
                self._withdrawn(live, "cancelled")
        elif self.shared is not None:
            refreshed = await self._refresh_elsewhere(session_id, fire_in_s)
            if refreshed is not None:
                return refreshed
        if not lands:
            self.tools.skipped_early(session_id)
            log.info("advisory_skipped", reason="cannot_land", kind=kind)
            return {"object": "advisory", "state": "skipped", "reason": "cannot_land"}
        tier = await self._tier(session_id, tenant_id, kind, now)
        if tier == "none":
            self.stats.skipped(kind)
            self.replicas.count({f"{kind}:skipped": 1})
            log.info("advisory_skipped", reason="hints_mostly_wasted", kind=kind)
            return {"object": "advisory", "state": "skipped", "reason": "hints_mostly_wasted"}
        if decision is not None and decision.action != "offload":
            worker = worker or self._home_worker(session_id)  # a short tool: the KV stays where it is
        worker = worker or self.router.choose(session_id, tenant_id)
        if worker is None:
            return {"object": "advisory", "state": "skipped", "reason": "no_routable_worker"}
        ttl_s = self.book.ttl_s + (expected_in_s or 0.0)
        wall = self.wall()
        detail: dict[str, Any] = {
            "target": tier,
            "expected_in_ms": None if expected_in_s is None else round(expected_in_s * 1000),
        }
        if decision is not None:
            detail["tool_kv"] = decision.detail()
        record = await self.store.create_advisory(
            session_id,
            tenant_id=tenant_id,
            kind=kind,
            target_worker=worker.id,
            created_at=wall,
            expires_at=wall + timedelta(seconds=ttl_s),
            detail=detail,
        )
        advisory = LiveAdvisory(
            id=record.id,
            session_id=session_id,
            tenant_id=tenant_id,
            kind=kind,
            worker_id=worker.id,
            worker_url=worker.url,
            target=tier,
            created_at=now,
            fire_at=now + fire_in_s,
            expires_at=now + ttl_s,
        )
        if decision is not None:
            self.tools.apply(decision, advisory, now)
        self.book.add(advisory)
        to_fire = self.book.due(now)
        if self.shared is not None:  # shared before its prefetch starts, so its updates find it
            await self.replicas.put(advisory, self._to_unix(advisory.expires_at))
        for each in to_fire:
            self._spawn(self._fire(each))
        log.info("advisory_created", advisory_id=record.id, kind=kind, worker=worker.id, target=tier)
        return self._answer(advisory, "fired" if advisory.fired else "scheduled", now)

    async def _skip_early(self, advisory: LiveAdvisory, now: float) -> dict[str, Any]:
        """Drop a scheduled prefetch that a tool result would fire too late to land, as a fire replaces it: the
        advisory is withdrawn (settled cancelled, so no reservation) and the turn's routing counts its own load."""
        self.book.withdraw(advisory.session_id)
        log.info("advisory_early_skipped", advisory_id=advisory.id, kind=advisory.kind, reason="cannot_land")
        self.tools.skipped_early(advisory.session_id)
        if await self.replicas.take_back(advisory):
            self._withdrawn(advisory, "cancelled")
        return self._answer(advisory, "skipped", now) | {"reason": "cannot_land", "expires_in_s": 0.0}

    async def stopped(self, session_id: str) -> dict[str, Any]:
        now = self.clock()
        advisory = self.book.stop(session_id, now)
        if advisory is None and self.shared is not None:
            return await self._stop_elsewhere(session_id)
        if advisory is None:
            return {"object": "advisory", "state": "none"}
        await self.replicas.update(advisory, expires_at=self._to_unix(advisory.expires_at), stopped=True)
        return self._answer(advisory, "stopping", now)

    def _answer(self, advisory: LiveAdvisory, state: str, now: float) -> dict[str, Any]:
        return {
            "object": "advisory",
            "id": advisory.id,
            "state": state,
            "kind": advisory.kind,
            "worker": advisory.worker_id,
            "target": advisory.target,
            "expires_in_s": round(max(advisory.expires_at - now, 0.0), 3),
        }

    # the chat path (synchronous: never delays a turn; with replicas, one shared round trip before routing)

    async def prepare_turn(self, session_id: str) -> None:
        """Replicas only: claim the session's shared advisory into this replica's book (where `reservation` and
        `on_request` find it, as if made here) and take the shared KV belief. Unreachable: the book decides."""
        turn = await self.replicas.begin_turn(session_id)
        if turn is None:
            return
        self.router.load_kv(session_id, turn.kv)
        local, record = self.book.live.get(session_id), turn.advisory
        if local is not None and record is not None and local.id == record.id:
            local.shared = False  # claimed out of the shared state: this replica's alone now
            return
        if local is not None and local.shared:
            # Not claimable: claimed by a turn on another replica, expired, or replaced there. Its end (the shared
            # state says which) settles it, or leaves it to the replica that claimed it.
            if record is None:
                local.expires_at = min(local.expires_at, self.clock())  # the next tick ends it
            else:
                self.book.withdraw(session_id)
                self._spawn(self._end_shared(local))
        elif local is not None and record is not None:
            self.book.withdraw(session_id)  # made here while the shared state was down: the shared one wins
            self._withdrawn(local, "cancelled")
        if record is None:
            return
        self.book.add(self.replicas.local(record, self.clock()))

    def on_request(self, session_id: str, tenant_id: str, turn_id: str, turn_seq: int, worker_id: str) -> Claim | None:
        """A turn was routed: it claims the session's live advisory (returned: the turn's trace links to its
        prefetch), or counts as missed when none foresaw it."""
        now = self.clock()
        foreseen = self.tools.turn_began(session_id, now)
        claim = self.book.claim(session_id, worker_id, now)
        if claim is not None:
            self._claims[turn_id] = claim
            self.stats.claimed += 1
            self.replicas.count({"claimed": 1})
        elif turn_seq > 1 and not foreseen:  # a dropped early prefetch's turn was foreseen (settled cancelled)
            self.stats.missed += 1
            self.replicas.count({"missed": 1})
            self._missed.append(sessions.MissedTurn(session_id, tenant_id, turn_id, self.wall()))
            if len(self._missed) == 1:
                self._spawn(self._flush_missed_later())
        return claim

    def on_turn_end(
        self,
        session_id: str,
        tenant_id: str,
        turn_id: str,
        *,
        cache_details: Mapping[str, Any] | None,
        tool_names: Sequence[str] = (),
    ) -> None:
        claim = self._claims.pop(turn_id, None)
        if claim is not None:
            self._settle(claim.advisory, settle(claim, cache_details), turn_id=turn_id, lead_s=claim.lead_s)
        if tool_names and self.tool_kv_enabled:
            decision = self.plan_tool_kv(session_id, tenant_id, tool_names)
            self._spawn(self._signal_quietly(session_id, tenant_id, "tool_call", None, decision=decision))

    def plan_tool_kv(self, session_id: str, tenant_id: str, tool_names: Sequence[str]) -> ToolKVDecision:
        """Keep the session's KV on the device through its tools, or let it go and prefetch it back (toolkv.py)."""
        return self.tools.plan(tenant_id, tool_names, self.router.belief.context_tokens(session_id))

    async def on_tool_result(self, call: sessions.ToolCallRecord, tenant_id: str) -> dict[str, Any] | None:
        """A tool result was posted: learn its duration; advise at the first or the last of the turn's calls."""
        if call.duration_ms is not None:
            self.tools.durations.record(tenant_id, call.name, call.duration_ms / 1000)
        pending = await self.store.pending_tool_calls(call.session_id, tenant_id=tenant_id)
        left = [c for c in pending if c.turn_id == call.turn_id]
        if self.tool_result_trigger == "last" and left:
            return None
        self.tools.result_posted(call.session_id, tenant_id, self.clock())
        return await self.signal(call.session_id, tenant_id, "tool_result")

    # I/O, in background tasks

    async def _signal_quietly(
        self,
        session_id: str,
        tenant_id: str,
        kind: str,
        expected_in_s: float | None,
        *,
        decision: ToolKVDecision | None = None,
    ) -> None:
        try:
            await self.signal(session_id, tenant_id, kind, expected_in_s=expected_in_s, decision=decision)
        except sessions.StoreError as exc:
            log.warning("advisory_not_created", kind=kind, error=str(exc))

    async def _fire(self, advisory: LiveAdvisory) -> None:
        if not await self.replicas.update(advisory, fired=True):
            return  # a turn on another replica claimed it before it was due: nothing left to prefetch for
        try:
            await self.prefetcher.run(advisory, live=lambda: self.book.live.get(advisory.session_id) is advisory)
        except (UpstreamError, sessions.StoreError) as exc:
            advisory.failed = True
            await self.replicas.update(advisory, failed=True)
            unsupported = isinstance(exc, WorkerRejected) and exc.status_code == 404
            log.info("prefetch_failed", advisory_id=advisory.id, worker=advisory.worker_id, unsupported=unsupported)

    def _settle(
        self, advisory: LiveAdvisory, outcome: str, *, turn_id: str | None, lead_s: float | None = None
    ) -> None:
        self.quality.record(advisory.session_id, advisory.tenant_id, advisory.kind, outcome, self.clock())
        if self.shared is not None and outcome in ("used", "late", "wasted"):
            self._spawn(self.replicas.add_outcome(advisory, self.quality.is_wasted(advisory.kind, outcome)))
        self.stats.settled(advisory.kind, outcome, lead_s=lead_s, bytes_loaded=advisory.bytes_loaded)
        self.replicas.count(
            AdvisoryStats.deltas(advisory.kind, outcome, lead_s=lead_s, bytes_loaded=advisory.bytes_loaded)
        )
        log.info("advisory_settled", advisory_id=advisory.id, kind=advisory.kind, outcome=outcome)
        self._spawn(self._resolve(advisory.id, outcome, turn_id), record=True)

    async def _resolve(self, advisory_id: str, outcome: str, turn_id: str | None) -> None:
        try:
            await self.store.resolve_advisory(advisory_id, outcome=outcome, resolved_at=self.wall(), turn_id=turn_id)
        except sessions.StoreError as exc:
            log.warning("advisory_not_resolved", advisory_id=advisory_id, error=str(exc))

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

    # replicas: the shared copy of the book (every method here is a no-op or unused with one process)

    def _to_unix(self, monotonic: float) -> float:
        return monotonic - self.clock() + self.unix()

    async def _refresh_elsewhere(self, session_id: str, fire_in_s: float) -> dict[str, Any] | None:
        """A signal for a session whose live advisory another replica owns: extend that one (debounce across
        replicas) instead of starting a second prefetch. None when there is none (or the shared state is down)."""
        found = await self.replicas.extend(session_id, fire_in_s, self.book.ttl_s)
        if found is None:
            return None
        record, expires_in_s = found
        return self._answer(self.replicas.local(record, self.clock()), "refreshed", self.clock()) | {
            "expires_in_s": round(expires_in_s, 3)
        }

    async def _stop_elsewhere(self, session_id: str) -> dict[str, Any]:
        found = await self.replicas.stop(session_id, self.book.stop_grace_s)
        if found is None:
            return {"object": "advisory", "state": "none"}
        record, expires_in_s = found
        return self._answer(self.replicas.local(record, self.clock()), "stopping", self.clock()) | {
            "expires_in_s": round(expires_in_s, 3)
        }

    async def _end_shared(self, advisory: LiveAdvisory) -> None:
        """This replica's copy of a shared advisory expired: settle it unless a turn claimed it (anywhere) or a
        signal on another replica extended it."""
        state, record = await self.replicas.end(advisory)
        if state == "gone":
            log.info("advisory_claimed_elsewhere", advisory_id=advisory.id)
            return
        if record is not None:
            advisory.stopped = record.stopped
        if state == "extended" and record is not None and self.book.live.get(advisory.session_id) is None:
            advisory.expires_at = record.expires_at - self.unix() + self.clock()
            self.book.add(advisory)
            return
        self._withdrawn(advisory, "cancelled" if advisory.stopped else "wasted")

    async def _tier(self, session_id: str, tenant_id: str, kind: str, now: float) -> Tier:
        """The adaptive rule's tier, by every replica's outcomes when they are shared (else this one's)."""
        tier = await self.replicas.tier(session_id, tenant_id, kind)
        return self.quality.tier(session_id, tenant_id, kind, now) if tier is None else tier

    async def report(self) -> dict[str, Any]:
        """The advisory statistics: every replica's together when they share state (else, or while the shared
        state does not answer, this replica's), with the scope they cover."""
        counters = await self.replicas.counters()
        if counters is not None:
            return AdvisoryStats.from_counters(counters).report() | {"scope": "replicas"}
        return self.stats.report() | {"scope": "replica"}
