"""A simulated cluster: N `SimWorker`s behind the gateway's own routing and advisor objects, and the sessions.

Nothing of the gateway's decision logic is re-implemented here. The wiring mirrors
`sessiongate/gateway/routing/router.py`, `sessiongate/gateway/turn/chat.py` and
`sessiongate/gateway/advisor/service.py`, with the simulated clock in place of `time.monotonic`:

- each request: `AdvisorBook.reservation` (advisories on), a `RouteRequest` built as `Router.route_request`
  builds it (`KVBelief.residency`, the prompt's tokens or the belief's context, whichever is larger; the prompt's
  text only for `cache_aware`, which matches on it), the policy's `choose` over `WorkerView`s, then
  `AdvisorBook.claim`; a turn after the first with no claim counts as missed;
- the belief: `KVBelief` with each worker's device and host KV capacities (`set_capacity`; the gateway reads them
  from the load reports), so a session other sessions' turns pushed out of a worker's LRU tiers is believed gone;
- each finished turn: `KVBelief.after_turn` with the turn's cache report (tokens found on device, in host, in
  storage, and the storage backend when the system has a pool), then `settle` of the claim and
  `HintQuality.record`, as `Advisor.on_turn_end`;
- each hint: `Advisor.signal` (a live advisory is refreshed while the policy, offered it as a reservation, still
  picks its worker, else withdrawn and settled as cancelled; then `HintQuality.tier`, the policy's choice for the
  session, a `LiveAdvisory` firing now, or for a typing hint once its tenant's typing gaps are learnt
  (`TypingGaps`) `lead_s` before the turn they expect, at the policy's choice then, and expiring after the ttl),
  the prefetch on the chosen worker, and when it finishes `ready_at` and `KVBelief.after_prefetch` with
  `prefetch_residency` (only while the advisory is still live, as the gateway's polling loop); expiries settle as
  wasted (`AdvisorBook.expire`). An advisory that ends with no use on its worker (expired, or its turn went
  elsewhere) stops ranking its pages there, as the gateway cancels its prefetch. A system with the
  tool-call KV lifecycle takes its hints, and the tool results its agents post, through `toolkv.SimToolKV.signal`
  (the whole of `advisor.decide.decide`, early fire and early skip included).

Two idealisations, said once: load reports are fresh at every choice (the gateway's are up to 2 s old), and the
workers' prefill/decode rates in `WorkerView` are left empty so `CostModel` uses the calibration's rates (the
gateway reads each worker's measured speeds while working, which vary with batch sizes and chunking).
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sessiongate.benchmarks.metrics import TurnRecord
from sessiongate.benchmarks.workloads import Hint, HintModel, SessionTrace, plan_hints
from sessiongate.gateway.advisor.core import AdvisorBook, Claim, LiveAdvisory, prefetch_residency, settle
from sessiongate.gateway.advisor.decide import Signal, timing
from sessiongate.gateway.advisor.quality import HintQuality
from sessiongate.gateway.advisor.stats import AdvisoryStats
from sessiongate.gateway.advisor.toolkv import ToolKVPolicy
from sessiongate.gateway.advisor.typing_gaps import TypingGaps
from sessiongate.gateway.routing import (
    CacheAware,
    KVBelief,
    Reservation,
    RouteRequest,
    RoutingPolicy,
    WorkerView,
    make_policy,
)
from sessiongate.gateway.settings import GatewaySettings

from .calibration import Calibration
from .engine import EventLoop, Machine, Request, SharedPool, SimWorker
from .systems import SYSTEMS, SystemSpec
from .toolkv import SimToolKV

__all__ = ["SYSTEMS", "SimResult", "SystemSpec", "oracle_hints", "oracle_lead_s", "simulate"]

TENANT = "sim"
# The gateway's text has about 4 characters a token (`gateway.routing.router._CHARS_PER_TOKEN`); hashing that for every
# long Mooncake prompt dominates a cache_aware run, so the simulated text has one character a token and the
# prefix index keeps as many tokens as the gateway's: blocks of 32 tokens instead of 8, a quarter of the work.
CHARS_PER_TOKEN = 1
GATEWAY_CHARS_PER_TOKEN = 4
_GATEWAY_MAX_BLOCKS: int = inspect.signature(CacheAware).parameters["max_blocks"].default
_HINT_SIGNAL = {"typing": "typing", "tool": "tool_result", "explicit": "explicit"}


@dataclass(slots=True)
class SimResult:
    system: str
    records: list[TurnRecord]
    bytes_moved: dict[str, int]
    advisories: dict[str, int]
    events: int
    policy: RoutingPolicy
    advisory_report: dict[str, Any] = field(default_factory=dict)
    # The lifecycle's learnt median gap between a posted tool result and the next turn, at the end (None: fewer
    # than `ResultGaps.min_samples`, or no results posted).
    result_gap_median_s: float | None = None


# How long after its turn's expected arrival the oracle's rank and reservation still hold (the turn comes on time;
# this covers its routing and admission).
ORACLE_SLACK_S = 1.0


def oracle_lead_s(context_tokens: int, cal: Calibration) -> float:
    """The ideal lead for a prefetch of `context_tokens`: what loading it from the pool to the device takes at the
    calibration's rates, half as much again for the channels' queues, and 50 ms. Less and the turn waits for its
    KV; more only holds memory longer."""
    moved = context_tokens * cal.kv_bytes_per_token
    load = (
        cal.pool_to_host_latency_s
        + moved / cal.pool_to_host_bytes_per_s
        + cal.host_to_device_latency_s
        + moved / cal.host_to_device_bytes_per_s
    )
    return 1.5 * load + 0.05


def oracle_hints(session: SessionTrace) -> list[Hint]:
    """The oracle's hints for `session`: one per turn after the first, at the previous answer's end (when the next
    turn becomes certain), none false, none missed; what it does with them is `_Cluster._oracle_hint`."""
    hints = []
    for k in range(1, len(session.turns)):
        hints.append(Hint(session.id, k, 0.0, "tool" if session.turns[k].kind == "tool" else "typing"))
    return hints


def _segment(session_id: str, turn: int, part: str, chars: int) -> str:
    unit = f"<{session_id}:{turn}{part}>"
    return (unit * (chars // len(unit) + 1))[:chars]


def session_text(session: SessionTrace, k: int) -> str:
    """Synthetic prompt text of turn k, `CHARS_PER_TOKEN` characters a token; it extends turn k-1's exactly."""
    parts = []
    for j, turn in enumerate(session.turns[: k + 1]):
        parts.append(_segment(session.id, j, "u", turn.append_tokens * CHARS_PER_TOKEN))
        if j < k:
            parts.append(_segment(session.id, j, "a", turn.output_tokens * CHARS_PER_TOKEN))
    return "".join(parts)


class _Cluster:
    def __init__(
        self,
        spec: SystemSpec,
        cal: Calibration,
        workers: int,
        *,
        hints: HintModel | None,
        seed: int,
        ttl_s: float,
        follow_ups: dict[str, tuple[str, float]],
    ) -> None:
        self.spec = spec
        self.cal = cal
        self.loop = EventLoop()
        self.bytes_moved = {"pool->host": 0, "host->device": 0}
        self.pool = SharedPool(cal.pool_kv_tokens_per_worker * workers) if spec.pool else None
        # The CPU replay's workers share one machine with the front; GPU workers share nothing.
        self.machine = Machine(workers, cal.cores) if cal.cores is not None else None
        self.workers = [
            SimWorker(
                f"w{i:02d}",
                cal,
                self.loop,
                host_tier=spec.host_tier,
                pool=self.pool,
                on_done=self._turn_done,
                bytes_moved=self.bytes_moved,
                machine=self.machine,
            )
            for i in range(workers)
        ]
        self.by_id = {w.id: w for w in self.workers}
        self.policy: RoutingPolicy = (
            CacheAware(max_blocks=_GATEWAY_MAX_BLOCKS * CHARS_PER_TOKEN // GATEWAY_CHARS_PER_TOKEN)
            if spec.policy == "cache_aware"
            else make_policy(spec.policy, cost=cal.cost_model())
        )
        self.belief = KVBelief()
        for worker in self.workers:  # the gateway reads them from each worker's load report
            self.belief.set_capacity(
                worker.id, device_tokens=cal.device_kv_tokens, host_tokens=cal.host_kv_tokens if spec.host_tier else 0
            )
        self.book = AdvisorBook(ttl_s=ttl_s)
        # The gateway's defaults: typing prefetches at once, or (timed) their load time before the learnt gap.
        defaults = GatewaySettings.model_fields
        timed = defaults["advisory_typing_timed"].default if spec.typing_timed is None else spec.typing_timed
        self.typing_gaps = TypingGaps(defaults["advisory_typing_quantile"].default) if timed else None
        self.lead_s: float = defaults["advisory_lead_s"].default
        self.quality = HintQuality()
        self.stats = AdvisoryStats()
        self.hints = hints if spec.advisories else None
        self.seed = seed
        self.follow_ups = follow_ups
        self.sessions: dict[str, SessionTrace] = {}
        self.planned: dict[str, dict[int | None, list[Hint]]] = {}
        self.claims: dict[tuple[str, int], Claim] = {}
        self.records: list[TurnRecord] = []
        self._advisory_ids = 0
        self._last_worker: dict[str, str] = {}
        self._arrivals: dict[tuple[str, int], float] = {}  # each turn's send time, once its previous turn ended
        self.tool_kv: SimToolKV | None = None
        cost = cal.cost_model()
        # The gateway's load-time estimate (wiring.py): it times tools' prefetches and typing hints' learnt ones.
        self.load_policy = ToolKVPolicy(
            kv_bytes_per_token=cal.kv_bytes_per_token,
            load_bytes_per_s=cost.pool_to_device_bytes_per_s,
            load_latency_s=cost.pool_to_device_latency_s,
        )
        if spec.tool_kv:
            self.tool_kv = SimToolKV(self, self.load_policy)

    # sessions

    def start(self, sessions: Sequence[SessionTrace]) -> None:
        following = {sid for sid, _ in self.follow_ups.values()}
        for session in sessions:
            self.sessions[session.id] = session
            if self.hints is not None:
                by_anchor: dict[int | None, list[Hint]] = {}
                planned = (
                    oracle_hints(session)
                    if self.spec.oracle
                    else plan_hints(session, self.hints, random.Random(f"{self.seed}:{session.id}"))
                )
                for hint in planned:
                    if self.tool_kv is not None and hint.kind == "tool" and hint.turn is not None:
                        continue  # the gateway learns of the tool call from the turn itself
                    anchor = hint.after_turn if hint.turn is None else hint.turn - 1
                    by_anchor.setdefault(anchor, []).append(hint)
                self.planned[session.id] = by_anchor
            if session.id not in following:
                self.loop.at(session.start_s, self._send, (session.id, 0))

    def _send(self, item: tuple[str, int]) -> None:
        session_id, k = item
        session = self.sessions[session_id]
        now = self.loop.now
        turn = session.turns[k]
        prompt = session.prompt_tokens(k)
        if self.tool_kv is not None and turn.kind == "tool" and turn.result_gap_s is None:
            self.tool_kv.tool_returned(TENANT, turn.gap_s)  # its result is in this request: the store records it
        request = Request(session_id, k, prompt, turn.output_tokens, now)
        reservation = self.book.reservation(session_id, now) if self.hints is not None else None
        text = session_text(session, k) if self.spec.policy == "cache_aware" else ""
        route = RouteRequest(
            session_id=session_id,
            tenant_id=TENANT,
            prompt_tokens=max(prompt, self.belief.context_tokens(session_id)),
            prompt_text=text,
            kv=self.belief.residency(session_id, now),
            reservation=reservation,
            now=now,
        )
        worker = self.by_id[self.policy.choose(route, self._views()).id]
        if self.hints is not None:
            # `Advisor.on_request`: a turn foreseen by a dropped early prefetch is not missed.
            foreseen = self.tool_kv is not None and self.tool_kv.turn_began(session_id)
            if self.typing_gaps is not None:
                self.typing_gaps.turn_began(session_id, now)
            claim = self.book.claim(session_id, worker.id, now)
            if claim is not None:
                self.claims[(session_id, k)] = claim
                self.stats.claimed += 1
                if claim.provisional == "wasted":  # went elsewhere: the gateway cancels the prefetch there
                    self.by_id[claim.advisory.worker_id].unrank(session_id)
            elif k > 0 and not foreseen:
                self.stats.missed += 1
        if self.machine is not None:
            self.machine.charge_front(
                now, self.cal.front_cpu_s_per_turn + turn.output_tokens * self.cal.front_cpu_s_per_token
            )
        if self.cal.request_overhead_s > 0:
            self.loop.at(now + self.cal.request_overhead_s, worker.submit, request)
        else:
            worker.submit(request)

    def _views(self) -> list[WorkerView]:
        if self.spec.counts_only:
            return [
                dataclasses.replace(w.view(), active_prefill_tokens=None, active_kv_tokens=None) for w in self.workers
            ]
        return [w.view() for w in self.workers]

    def _turn_done(self, request: Request) -> None:
        now = self.loop.now
        self.records.append(
            TurnRecord(
                system=self.spec.name,
                session_id=request.session_id,
                turn=request.turn,
                sent_s=request.sent_s,
                first_token_s=request.first_token_s,
                done_s=request.done_s,
                prompt_tokens=request.prompt,
                output_tokens=request.output,
                cached_device=request.device,
                cached_host=request.host,
                cached_pool=request.pool,
                worker=request.worker,
                error=request.error,
            )
        )
        session = self.sessions[request.session_id]
        details: dict[str, Any] = {"device": request.device, "host": request.host, "storage": request.pool}
        if self.spec.pool:
            details["storage_backend"] = "pool"
        if self.typing_gaps is not None:
            self.typing_gaps.turn_ended(request.session_id, now)
        if request.error is None:
            self._last_worker[request.session_id] = request.worker
            self.belief.after_turn(
                request.session_id,
                request.worker,
                prompt_tokens=request.prompt,
                completion_tokens=request.output,
                details=details,
                now=now,
            )
        claim = self.claims.pop((request.session_id, request.turn), None)
        if claim is not None:
            self._settle(claim.advisory, settle(claim, details if request.error is None else None), claim.lead_s)
        k = request.turn
        for hint in self.planned.get(request.session_id, {}).get(k, ()):
            at = now + hint.after_prev_end_s if hint.at_s is None else max(now, hint.at_s)
            self.loop.at(at, self._hint, hint)
        if k + 1 < len(session.turns):
            following = session.turns[k + 1]
            send_at = now + following.gap_s if following.at_s is None else max(now, following.at_s)
            if self.tool_kv is not None and following.kind == "tool" and request.error is None:
                self.tool_kv.on_tool_call(request.session_id, TENANT)
                if following.result_gap_s is not None:
                    # Posted when the tool returns, before the request (first at equal times: the client awaits
                    # the post's answer, then sends).
                    returned_at = max(now, send_at - following.result_gap_s)
                    self.loop.at(returned_at, self._tool_result, (request.session_id, returned_at - now))
            if self.spec.hints_know_arrival:
                self._arrivals[(request.session_id, k + 1)] = send_at
            self.loop.at(send_at, self._send, (request.session_id, k + 1))
        elif request.session_id in self.follow_ups:
            next_id, delay = self.follow_ups[request.session_id]
            self.loop.at(now + delay, self._send, (next_id, 0))

    # the advisor (Advisor.signal and tick; Executor.fire and settle)

    def _tool_result(self, item: tuple[str, float]) -> None:
        assert self.tool_kv is not None
        session_id, tool_s = item
        self.tool_kv.tool_result(session_id, TENANT, tool_s)

    def _hint(self, hint: Hint) -> None:
        now = self.loop.now
        session_id = hint.session_id
        kind = _HINT_SIGNAL[hint.kind]
        if self.spec.oracle:
            self._oracle_hint(hint)
            return
        if self.tool_kv is not None:
            self.tool_kv.signal(session_id, TENANT, kind)
            return
        worker: WorkerView | None = None
        live = self.book.get(session_id, now)
        if live is not None:
            # Where would the request go now? The live advisory's worker is offered as a reservation.
            keep = None if live.failed else Reservation(worker_id=live.worker_id, expires_at=live.expires_at)
            worker = self.policy.choose(self._route_for_hint(session_id, now, keep), self._views())
            if worker.id == live.worker_id:
                refreshed = self.book.refresh(session_id, now)
                if refreshed is not None:
                    self.loop.at(refreshed.expires_at, self._expire)
                return
            self.book.withdraw(session_id)  # the load moved: the request would not go there any more
            self.by_id[live.worker_id].unrank(session_id)
            self._settle(live, "cancelled", None)
        tier = self.quality.tier(session_id, TENANT, kind, now)
        if tier == "none":
            self.stats.skipped(kind)
            return
        worker = worker or self.policy.choose(self._route_for_hint(session_id, now, None), self._views())
        signal = Signal(session_id, TENANT, kind)
        if kind == "typing" and self.typing_gaps is not None:  # `Advisor.signal`'s timed typing hint
            lead_s = max(self.load_policy.lead_s(self.belief.context_tokens(session_id)), self.lead_s)
            signal = replace(signal, expected_in_s=self.typing_gaps.started(session_id, TENANT, now), lead_s=lead_s)
        if self.spec.hints_know_arrival and hint.turn is not None:
            arrival = self._arrivals.pop((session_id, hint.turn), None)
            if arrival is not None:
                tokens = self.belief.context_tokens(session_id)
                signal = replace(signal, expected_in_s=max(arrival - now, 0.0), lead_s=oracle_lead_s(tokens, self.cal))
        expected_in_s, fire_in_s = timing(signal, self.lead_s)
        fire_at = now + fire_in_s
        advisory = self._new_advisory(
            session_id, TENANT, kind, worker, tier, now, fire_at=fire_at, expires_in_s=expected_in_s or 0.0
        )
        self.book.add(advisory)
        if fire_at > now:
            self.loop.at(fire_at, self._fire_due)
        for due in self.book.due(now):
            self._fire(due)
        self.loop.at(advisory.expires_at, self._expire)

    def _oracle_hint(self, hint: Hint) -> None:
        """The oracle knows, when a turn ends, when the next one comes: the KV the turn left ranks as expected until
        then (in both tiers of the worker that holds it), and a prefetch to the device, at the worker the policy
        picks at that time, fires `oracle_lead_s` before the turn (at once when the gap is shorter)."""
        now = self.loop.now
        session_id = hint.session_id
        assert hint.turn is not None
        turn = self.sessions[session_id].turns[hint.turn]
        arrival = now + turn.gap_s if turn.at_s is None else max(now, turn.at_s)
        until = arrival + ORACLE_SLACK_S
        home = self._last_worker.get(session_id)
        if home is not None:
            self.by_id[home].retain(session_id, until, host=True)
        lead = oracle_lead_s(self.belief.context_tokens(session_id), self.cal)
        fire_at = max(now, arrival - lead)
        worker = self.policy.choose(self._route_for_hint(session_id, now, None), self._views())
        kind = _HINT_SIGNAL[hint.kind]
        advisory = self._new_advisory(
            session_id, TENANT, kind, worker, "device", now, fire_at=fire_at, expires_in_s=until - now - self.book.ttl_s
        )
        self.book.add(advisory)
        self.loop.at(fire_at, self._fire_due)
        self.loop.at(advisory.expires_at, self._expire)

    def _fire_due(self, _: object = None) -> None:
        """Scheduled advisories whose time has come fire at the worker the policy picks now (`Advisor.tick`)."""
        for advisory in self.book.due(self.loop.now):
            self._retarget(advisory)
            self._fire(advisory)

    def _retarget(self, advisory: LiveAdvisory) -> None:
        """`Executor.retarget`: point a not yet fired advisory at the policy's choice now."""
        worker = self.policy.choose(self._route_for_hint(advisory.session_id, self.loop.now, None), self._views())
        advisory.worker_id, advisory.worker_url = worker.id, worker.url

    def _new_advisory(
        self,
        session_id: str,
        tenant_id: str,
        kind: str,
        worker: WorkerView,
        target: str,
        now: float,
        *,
        fire_at: float,
        expires_in_s: float = 0.0,
    ) -> LiveAdvisory:
        """A `LiveAdvisory` as `Executor` makes one (numbered in order), expiring the ttl plus
        `expires_in_s` from now; not yet in the book."""
        self._advisory_ids += 1
        return LiveAdvisory(
            id=f"adv-{self._advisory_ids}",
            session_id=session_id,
            tenant_id=tenant_id,
            kind=kind,
            worker_id=worker.id,
            worker_url=worker.url,
            target=target,
            created_at=now,
            fire_at=fire_at,
            expires_at=now + self.book.ttl_s + expires_in_s,
        )

    def _route_for_hint(self, session_id: str, now: float, reservation: Reservation | None) -> RouteRequest:
        """`Router.route_request` with no messages: the belief's context is the prompt estimate."""
        return RouteRequest(
            session_id=session_id,
            tenant_id=TENANT,
            prompt_tokens=self.belief.context_tokens(session_id),
            kv=self.belief.residency(session_id, now),
            reservation=reservation,
            now=now,
        )

    def _fire(self, advisory: LiveAdvisory) -> None:
        context = self.belief.context_tokens(advisory.session_id)
        if context == 0:
            advisory.ready_at = self.loop.now  # nothing to bring: the reservation alone
            return
        if advisory.action == "retain" and self.tool_kv is not None and self.tool_kv.retain(advisory):
            return  # `Prefetcher.run`: a retain that found the KV is all (else it falls back to a prefetch)
        if self.machine is not None:  # the gateway and the worker's HTTP process prepare the prefetch on these cores
            self.machine.charge_front(self.loop.now, self.cal.front_cpu_s_per_advisory)
        rank_until = advisory.expires_at if self.spec.ranked_prefetch else None
        result = self.by_id[advisory.worker_id].prefetch(advisory.session_id, advisory.target, rank_until)
        advisory.tokens = context

        def finished(_: object) -> None:
            if self.book.live.get(advisory.session_id) is not advisory:
                return  # claimed or withdrawn first: the gateway stops polling and learns nothing
            advisory.ready_at = self.loop.now
            advisory.bytes_loaded = result.bytes_loaded
            resident, tier = prefetch_residency(
                tokens=context,
                target=advisory.target,
                on_device=result.on_device,
                in_host=result.in_host,
                unavailable=max(context - result.on_device - result.in_host, 0),
            )
            self.belief.after_prefetch(
                advisory.session_id, advisory.worker_id, tokens=resident, tier=tier, now=self.loop.now
            )

        self.loop.at(result.ready_s, finished)

    def _expire(self, _: object) -> None:
        for advisory in self.book.expire(self.loop.now):
            self._settle(advisory, "cancelled" if advisory.stopped else "wasted", None)
            if advisory.fired:  # the gateway cancels its prefetch: its pages stop ranking as a live hint's
                self.by_id[advisory.worker_id].unrank(advisory.session_id)

    def _settle(self, advisory: LiveAdvisory, outcome: str, lead_s: float | None) -> None:
        self.quality.record(advisory.session_id, advisory.tenant_id, advisory.kind, outcome, self.loop.now)
        self.stats.settled(advisory.kind, outcome, lead_s=lead_s, bytes_loaded=advisory.bytes_loaded)

    def advisory_counts(self) -> dict[str, int]:
        counts = {"used": 0, "late": 0, "wasted": 0, "missed": self.stats.missed, "skipped": 0}
        for kind in self.stats.kinds.values():
            for outcome in ("used", "late", "wasted"):
                counts[outcome] += kind.outcomes.get(outcome, 0)
            counts["skipped"] += kind.skipped
        if self.tool_kv is not None:
            counts.update(self.tool_kv.decisions, results_posted=self.tool_kv.results_posted)
        for tier in ("device", "host"):
            counts[f"evicted_for_prefetch_{tier}_tokens"] = sum(w.prefetch_evictions[tier] for w in self.workers)
        return counts


def simulate(
    system: str,
    sessions: Sequence[SessionTrace],
    cal: Calibration,
    *,
    workers: int,
    hints: HintModel | None = None,
    seed: int = 0,
    ttl_s: float = 30.0,
    follow_ups: dict[str, tuple[str, float]] | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Run `sessions` through `workers` simulated workers of `system`; deterministic for a seed.

    `follow_ups` chains sessions for closed-loop users: session id -> (the user's next session, seconds between
    the end of one and the start of the next); a session that follows another ignores its own `start_s`.
    """
    spec = SYSTEMS[system]
    cluster = _Cluster(
        spec,
        cal,
        workers,
        hints=hints if hints is not None else HintModel(),
        seed=seed,
        ttl_s=ttl_s,
        follow_ups=follow_ups or {},
    )
    cluster.start(sessions)
    cluster.loop.run(progress)
    cluster.loop.at(cluster.loop.now + ttl_s + 1, cluster._expire)  # settle what is still live
    cluster.loop.run()
    records = sorted(cluster.records, key=lambda r: (r.sent_s, r.session_id, r.turn))
    return SimResult(
        system=system,
        records=records,
        bytes_moved=dict(cluster.bytes_moved),
        advisories=cluster.advisory_counts() if spec.advisories else {},
        events=cluster.loop.events,
        policy=cluster.policy,
        advisory_report=cluster.stats.report() if spec.advisories else {},
        result_gap_median_s=cluster.tool_kv.lifecycle.result_gaps.median(TENANT) if cluster.tool_kv else None,
    )
