"""The advisor: turns signals into advisory prefetches, and settles each advisory's outcome in the store.

On a signal it reads what it knows (the session's live advisory, whether a prefetch could land), asks the pure
decision (`decide.decide`) what to do, gathers the answers the decision asks for (the router's choice, the shared
state's advisory, the adaptive rule's tier, the home worker) and hands the actions to its executor
(`executor.Executor`), which does the I/O, all of it in background tasks but the signal's own store write: nothing
the chat path calls here awaits anything, and no advisor failure reaches a user's turn.

With replicas (`gateway.shared`, distributed) each live advisory is also in the shared state (`replicas.py`,
chosen once when the advisor is built: `advisories_for`). The replica that made it (its owner) runs its prefetch
and writes there when it fired, finished or failed; before each turn the serving replica claims the session's
advisory from there (`prepare_turn`: one atomic claim, so one turn on one replica gets it) and settles it after
the turn, as if it had made it. A signal on a replica that does not hold the session's live advisory refreshes or
stops the shared one, and a tool result there asks the owner to fire a scheduled one now (the owner polls for
such requests at its ticks while it holds a scheduled shared advisory: `honour_fire_requests`); when the owner's
copy expires it asks the shared state whether it ended, was extended, or
was claimed (then the claimer settled it). Hint quality outcomes go to shared lists as well, so the adaptive rule
judges a session, tenant or kind by every replica's outcomes. A shared state that does not answer leaves each
replica with its own book, as with one replica.

The parts it owns: the book (`core.AdvisorBook`, pure), the executor, the replicas' shared advisories, the tool-call
KV lifecycle's learnt state and its retain (`tool_lifecycle.ToolLifecycle`), and each advisory's prefetch, from the
store to the worker (`prefetch.Prefetcher`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog

from sessiongate import sessions
from sessiongate.gateway.observability.tracing import NO_TRACING, Tracing
from sessiongate.gateway.routing import Reservation
from sessiongate.gateway.routing.router import Router
from sessiongate.gateway.shared import SharedState
from sessiongate.gateway.workers.extension import ExtensionClient

from .core import AdvisorBook, Claim, settle
from .decide import Decision, Known, Need, Signal, decide, fire_requested, timing
from .executor import Executor
from .prefetch import Prefetcher
from .quality import HintQuality, Tier
from .replicas import advisories_for
from .stats import AdvisoryStats
from .tool_lifecycle import ToolLifecycle
from .toolkv import ResultGaps, ToolDurations, ToolKVDecision, ToolKVPolicy
from .typing_gaps import TypingGaps

__all__ = ["Advisor"]

log = structlog.get_logger(__name__)


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
        typing_quantile: float | None = None,
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
        # When a typing hint's turn is expected, learnt per tenant (None: typing prefetches fire at once).
        self.typing_gaps = TypingGaps(typing_quantile) if typing_quantile is not None else None
        self.lead_s = lead_s
        self.tool_result_trigger = tool_result_trigger
        self.clock = clock
        self.wall = wall
        self.unix = unix
        self._claims: dict[str, Claim] = {}
        # One signal at a time per session (see `signal`): the lock, and how many signals hold or await it.
        self._signal_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._polling_fire_requests = False  # one poll of the shared fire requests at a time
        # The replicas' shared advisories: no-ops with one process (asked once, here).
        self.replicas = advisories_for(shared, replica=replica, unix=unix, quality=self.quality)
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
        self.act = Executor(
            store=store,
            router=router,
            book=self.book,
            quality=self.quality,
            stats=self.stats,
            replicas=self.replicas,
            tools=self.tools,
            prefetcher=self.prefetcher,
            clock=lambda: self.clock(),
            wall=lambda: self.wall(),
            missed_flush_s=missed_flush_s,
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

    @property
    def missed_flush_s(self) -> float:
        return self.act.missed_flush_s

    @missed_flush_s.setter
    def missed_flush_s(self, seconds: float) -> None:
        self.act.missed_flush_s = seconds

    # background work

    async def aclose(self) -> None:
        await self.act.drain()

    async def run(self, interval_s: float = 0.05) -> None:
        """Fire scheduled advisories and settle expired ones, forever; cancelled at shutdown."""
        while True:
            self.tick()
            await asyncio.sleep(interval_s)

    def tick(self) -> None:
        if self.replicas.unflushed:
            self.act.spawn(self.replicas.flush_counts())
        if not self._polling_fire_requests and self.replicas.awaits_fire_requests(self.book):
            self._polling_fire_requests = True
            self.act.spawn(self.honour_fire_requests())
        now = self.clock()
        for advisory in self.book.lapse(now):
            # A keep_then_offload's retain lapsed: the KV is unprotected; its prefetch waits for the long kind.
            self.stats.tool_kv_event("retain_lapsed")
            if advisory.shared:
                self.act.spawn(self.act.lapse_shared(advisory))
        for advisory in self.book.due(now):
            if advisory.fire_at > advisory.created_at:
                self.act.retarget(advisory)  # scheduled for later: the router's choice may have changed since
            self.act.spawn(self.act.fire(advisory))
        for advisory in self.book.expire(now):
            if advisory.shared:
                self.act.spawn(self.act.end_shared(advisory))
            else:
                self.act.withdrawn(advisory, "cancelled" if advisory.stopped else "wasted")

    async def honour_fire_requests(self) -> None:
        """Fire the scheduled advisories of this replica's that a tool result on another replica asked it to fire
        now (`decide.fire_requested`): each fired early once, here, as with the result posted here."""
        try:
            requests = await self.replicas.fire_requests()
            now = self.clock()
            for session_id, advisory_id in requests:
                await self.act.perform(fire_requested(self.book.get(session_id, now), advisory_id), now)
        finally:
            self._polling_fire_requests = False

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
        lead_s: float | None = None
        if kind == "typing" and expected_in_s is None and self.typing_gaps is not None:
            expected_in_s = self.typing_gaps.started(session_id, tenant_id, self.clock())
            # Fired the context's load time (and a margin) before the expected turn, as a tool's prefetch.
            lead_s = max(self.tools.policy.lead_s(self.router.belief.context_tokens(session_id)), self.lead_s)
        lock, users = self._signal_locks.get(session_id) or (asyncio.Lock(), 0)
        self._signal_locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                return await self._signal(Signal(session_id, tenant_id, kind, expected_in_s, decision, lead_s))
        finally:
            lock, users = self._signal_locks[session_id]
            if users == 1:
                del self._signal_locks[session_id]
            else:
                self._signal_locks[session_id] = (lock, users - 1)

    async def _signal(self, signal: Signal) -> dict[str, Any]:
        now = self.clock()
        lands = signal.kind != "tool_result" or self.tools.early_fire_lands(
            signal.tenant_id, self.router.belief.context_tokens(signal.session_id)
        )
        known = Known(
            now=now, lead_s=self.lead_s, ttl_s=self.book.ttl_s, live=self.book.get(signal.session_id, now), lands=lands
        )
        while not isinstance(step := decide(signal, known), Decision):
            known = known.answered(step, await self._ask(step, signal, known))
        created = await self.act.perform(step.actions, now)
        return self.act.reply(step.reply, created, now)

    async def _ask(self, need: Need, signal: Signal, known: Known) -> object:
        """The answer the decision needs next (see decide.py)."""
        session_id, tenant_id = signal.session_id, signal.tenant_id
        if need == "choice_keeping":
            live = known.live
            assert live is not None
            keep = None if live.failed else Reservation(worker_id=live.worker_id, expires_at=live.expires_at)
            return self.router.choose(session_id, tenant_id, reservation=keep)
        if need == "elsewhere":
            _, fire_in_s = timing(signal, self.lead_s)
            return await self.replicas.refresh_elsewhere(session_id, fire_in_s, self.book.ttl_s, self.clock())
        if need == "fire_elsewhere":
            _, fire_in_s = timing(signal, self.lead_s)
            return await self.replicas.fire_elsewhere(session_id, fire_in_s, self.book.ttl_s, self.clock())
        if need == "tier":
            return await self._tier(session_id, tenant_id, signal.kind, known.now)
        if need == "home":
            return self.act.home_worker(session_id)
        return self.router.choose(session_id, tenant_id)

    async def _tier(self, session_id: str, tenant_id: str, kind: str, now: float) -> Tier:
        """The adaptive rule's tier, by every replica's outcomes when they are shared (else this one's)."""
        tier = await self.replicas.tier(session_id, tenant_id, kind)
        return self.quality.tier(session_id, tenant_id, kind, now) if tier is None else tier

    async def stopped(self, session_id: str) -> dict[str, Any]:
        now = self.clock()
        advisory = self.book.stop(session_id, now)
        if advisory is None:
            found = await self.replicas.stop_elsewhere(session_id, self.book.stop_grace_s, self.clock())
            if found is None:
                return {"object": "advisory", "state": "none"}
            return self.act.answer(found.advisory, "stopping", self.clock()) | {"expires_in_s": found.expires_in_s}
        await self.replicas.update(
            advisory, expires_at=self.replicas.to_unix(advisory.expires_at, self.clock()), stopped=True
        )
        return self.act.answer(advisory, "stopping", now)

    # the chat path (synchronous: never delays a turn; with replicas, one shared round trip before routing)

    async def prepare_turn(self, session_id: str) -> None:
        """Replicas only: claim the session's shared advisory into this replica's book (where `reservation` and
        `on_request` find it, as if made here) and take the shared KV belief. Unreachable: the book decides."""
        turn = await self.replicas.begin_turn(session_id)
        if turn is None:
            return
        self.router.load_kv(session_id, turn.kv)
        to_end, to_cancel = self.replicas.claim_into(self.book, session_id, turn.advisory, self.clock())
        if to_end is not None:
            self.act.spawn(self.act.end_shared(to_end))
        if to_cancel is not None:
            self.act.withdrawn(to_cancel, "cancelled")

    def on_request(self, session_id: str, tenant_id: str, turn_id: str, turn_seq: int, worker_id: str) -> Claim | None:
        """A turn was routed: it claims the session's live advisory (returned: the turn's trace links to its
        prefetch), or counts as missed when none foresaw it."""
        now = self.clock()
        foreseen = self.tools.turn_began(session_id, now)
        if self.typing_gaps is not None:
            self.typing_gaps.turn_began(session_id, now)
        claim = self.book.claim(session_id, worker_id, now)
        if claim is not None:
            self._claims[turn_id] = claim
            if claim.provisional == "wasted":
                # The turn went elsewhere: the pages prefetched for it there must not hold memory as a live hint's
                # until the ttl (in a replay about 37 such sessions at a time, ranked above every live hint's).
                self.act.end_prefetch(claim.advisory)
            self.stats.claimed += 1
            self.replicas.count({"claimed": 1})
        elif turn_seq > 1 and not foreseen:  # a dropped early prefetch's turn was foreseen (settled cancelled)
            self.act.missed(session_id, tenant_id, turn_id)
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
        if self.typing_gaps is not None:
            self.typing_gaps.turn_ended(session_id, self.clock())
        claim = self._claims.pop(turn_id, None)
        if claim is not None:
            self.act.settle(claim.advisory, settle(claim, cache_details), turn_id=turn_id, lead_s=claim.lead_s)
        if tool_names and self.tool_kv_enabled:
            decision = self.plan_tool_kv(session_id, tenant_id, tool_names)
            self.act.spawn(self._signal_quietly(session_id, tenant_id, "tool_call", decision=decision))

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

    async def _signal_quietly(self, session_id: str, tenant_id: str, kind: str, *, decision: ToolKVDecision) -> None:
        try:
            await self.signal(session_id, tenant_id, kind, decision=decision)
        except sessions.StoreError as exc:
            log.warning("advisory_not_created", kind=kind, error=str(exc))

    async def flush_missed(self) -> None:
        await self.act.flush_missed()

    async def report(self) -> dict[str, Any]:
        """The advisory statistics: every replica's together when they share state (else, or while the shared
        state does not answer, this replica's), with the scope they cover."""
        counters = await self.replicas.counters()
        if counters is not None:
            return AdvisoryStats.from_counters(counters).report() | {"scope": "replicas"}
        return self.stats.report() | {"scope": "replica"}
