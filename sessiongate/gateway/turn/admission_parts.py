"""The fair queue's parts (`admission`): its configuration, a turn's cost before the worker reports it, a turn's
slot in the active phase, the refusal of a turn predicted to wait too long, and the records the queue keeps per
session, tenant and waiting turn.

A turn that cannot start at once has a predicted wait: the turns that would start before it (its tenant's
waiting turns with a smaller tag, what the other waiting tenants start meanwhile by weight, and the shed turns
promised to come back within the bound) times the time between turn starts (`FairAdmission.per_start_s`). Past
`max_wait_s` the turn is refused at once (`ShedDecision`): 429 `fair_share_exceeded` when its tenant holds more than
its weighted share of the turns in the gateway (active and waiting), else 503 `gateway_saturated`, both with
`Retry-After` (and `retry-after-ms`): the return time the `retry_calendar` gave it.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from sessiongate.gateway.errors import RateLimited, Saturated

from .retry_calendar import Promise

__all__ = [
    "TAG_SPAN_TURNS",
    "AdmissionConfig",
    "FairSlot",
    "SessionRecord",
    "ShedDecision",
    "TenantRecord",
    "WaitHistogram",
    "Waiter",
    "estimate_cost",
]


# A new turn's start tag is at most this many mean turn costs past its tenant's virtual time: a session that
# used much more than the others waits behind about that many rounds of theirs, not until they have caught up
# with it. At two, turns late in a conversation (each resending a longer history) waited two rounds: with
# service times spread and the capacity swinging, the queue's wait p99 was 3.6-3.8 times its p50, against 2.2 at
# one, with the least session's share as high (`admission_sim --conversation-turns 20`, docs/benchmarks.md,
# "One round behind, not two").
TAG_SPAN_TURNS = 1.0


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """`max_active`: turns in their active phase at once (0: no limit, nothing queued or shed); `max_wait_s`: the
    predicted wait past which a turn is shed (0: never); `half_life_s`: of the attained service's decay. The defaults
    are the settings' (`GatewaySettings.admission_*`); `tag_span_turns` is the queue's own."""

    max_active: int
    max_wait_s: float
    half_life_s: float
    tag_span_turns: float = TAG_SPAN_TURNS


@dataclass(frozen=True, slots=True)
class ShedDecision:
    """Why a turn was refused: its predicted wait, the bound, and whether its tenant is over its fair share."""

    predicted_wait_s: float
    max_wait_s: float
    over_share: bool
    # When to come back: the calendar's return time (the excess over the bound alone brought 10,000 sessions back
    # every second; each turn's own predicted wait, all of them within seconds of each other).
    retry_after_s: float

    def error(self) -> RateLimited | Saturated:
        if self.over_share:
            return RateLimited(
                "The tenant holds more than its fair share of the gateway; retry later.",
                retry_after_s=self.retry_after_s,
                code="fair_share_exceeded",
            )
        return Saturated(
            "The gateway is saturated: this turn would wait longer than allowed; retry later.",
            retry_after_s=self.retry_after_s,
        )


def estimate_cost(body_bytes: int, max_tokens: int | None) -> int:
    """A turn's tokens before the worker reports them: about 4 bytes of JSON a prompt token, plus the answer's
    limit (256 when the request sets none)."""
    return body_bytes // 4 + (max_tokens or 256)


class WaitHistogram:
    """How long admitted turns waited in the queue (0 for a turn that started at once), in Prometheus's cumulative
    buckets: the bound the queue sheds at is kept or not by these waits."""

    BUCKETS_S = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0)

    __slots__ = ("counts", "total_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BUCKETS_S) + 1)  # per bucket, not cumulative; the last is past every bound
        self.total_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.BUCKETS_S, seconds)] += 1
        self.total_s += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """(upper bound, turns that waited at most that), ending with "+Inf": a Prometheus histogram's buckets."""
        edges = [*(str(bound) for bound in self.BUCKETS_S), "+Inf"]
        return list(zip(edges, itertools.accumulate(float(n) for n in self.counts), strict=True))


class SessionRecord:
    __slots__ = ("active", "pending", "promise", "service", "tenant_id", "waiting")

    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id
        # Its last turn was shed and told to come back then: the next one, on time, queues unless the queue is far past
        # the bound (`FairAdmission._retell`).
        self.promise: Promise | None = None
        self.service = 0.0  # scaled: the tokens its ended turns used (at least its tenant's virtual time, once queued)
        self.pending = 0.0  # scaled: the estimates of its turns queued or running
        self.waiting = 0
        self.active = 0


class TenantRecord:
    __slots__ = ("active", "queue", "served", "version", "virtual", "waiting", "weight")

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.served = 0.0  # scaled: turns started (their estimates until they end)
        self.virtual = 0.0  # scaled: the greatest tag started from the queue, the least a new turn's tag may be
        self.queue: list[tuple[float, int, Waiter]] = []  # (tag, seq, waiter), sorted
        self.waiting = 0
        self.active = 0
        self.version = 0  # of its entry in the tenants' heap


class Waiter:
    __slots__ = ("cost", "enqueued_at", "future", "seq", "session_id", "started_at", "tag", "tenant_id")

    def __init__(self, tenant_id: str, session_id: str, cost: int, tag: float, seq: int, enqueued_at: float) -> None:
        self.tenant_id = tenant_id
        self.session_id = session_id
        self.cost = cost
        self.tag = tag
        self.seq = seq
        self.enqueued_at = enqueued_at
        self.started_at = enqueued_at
        self.future: asyncio.Future[None] | None = None


class FairSlot:
    """One turn's place in the active phase: `release(tokens)` when it ends (idempotent), with the tokens it
    used, which replace the estimate it was charged (`on_release`: the queue's; None when nothing is queued)."""

    __slots__ = ("_on_release", "_released", "charged_at", "cost", "session_id", "started_at", "tenant_id")

    def __init__(
        self,
        on_release: Callable[[FairSlot, int], None] | None,
        tenant_id: str,
        session_id: str,
        cost: int,
        started_at: float,
        charged_at: float,
    ) -> None:
        self._on_release = on_release
        self._released = False
        self.tenant_id = tenant_id
        self.session_id = session_id
        self.cost = cost
        self.started_at = started_at
        self.charged_at = charged_at  # when its estimate was charged to its session (its arrival)

    def release(self, tokens: int | None = None) -> None:
        if self._released:
            return
        self._released = True
        if self._on_release is not None:
            self._on_release(self, self.cost if tokens is None else max(tokens, 0))
