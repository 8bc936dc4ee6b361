"""The fair queue's overload behaviour alone: a closed loop of sessions against the real `FairAdmission` on a
simulated clock, in seconds of CPU.

The load test (`load_test`) measures the whole gateway, where the queue's own logic is one effect among the event
loop's lag, the store and the client's lateness. Here every turn holds its slot for a service time (the active limit
over the capacity, times a log-normal factor with `--jitter`; the capacity swings by `--swing` every five seconds,
and falls steadily by `--fall` of itself over the run), sessions think for exponential times (mean `--think-time`),
and a shed turn comes back when its `Retry-After` says (plus up to `--late` seconds). The figures are the admitted
turns' waits in the queue after the warm-up, against the bound, the throughput against the capacity, and the turns
each session started after the warm-up against the mean (a fairness figure for runs without think time, where every
session always wants a turn).

    python -m sessiongate.benchmarks.admission_sim --sessions 10000 --capacity 150 --duration 200
    python -m sessiongate.benchmarks.admission_sim --jitter 0.5 --late 0.3 --swing 0.3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import itertools
import random
from dataclasses import dataclass

from sessiongate.gateway.errors import RateLimited, Saturated
from sessiongate.gateway.turn.admission import AdmissionConfig, FairAdmission, FairSlot
from sessiongate.gateway.turn.admission_parts import TAG_SPAN_TURNS

from .load_figures import percentiles

__all__ = ["SimConfig", "SimResult", "simulate"]


@dataclass(frozen=True)
class SimConfig:
    sessions: int = 10_000
    limit: int = 256
    capacity: float = 150.0  # turns a second the simulated gateway serves
    think_time_s: float = 20.0
    bound_s: float = 2.0
    duration_s: float = 200.0
    warmup_s: float = 80.0
    jitter: float = 0.0  # sigma of the service time's log-normal factor
    late_s: float = 0.0  # a shed turn comes back up to this much after its Retry-After
    swing: float = 0.0  # the capacity is (1 +- swing) times itself, alternating every five seconds
    fall: float = 0.0  # the capacity falls steadily to (1 - fall) times itself by the end of the run
    # 0: every turn costs 300 tokens; N: each session runs N-turn conversations (then starts over, as the load
    # test's do), turn k costing 60 + 32 k tokens: the history it resends grows with each question and answer.
    # The sessions start at random places in their conversations.
    conversation_turns: int = 0
    tag_span_turns: float = TAG_SPAN_TURNS  # the queue's (`AdmissionConfig.tag_span_turns`)
    seed: int = 0


@dataclass
class SimResult:
    admitted: int
    sheds: int
    throughput: float
    waits_s: dict[str, float]
    within_bound: float
    # Turns each session started after the warm-up, against the mean (`load_figures.fairness`' turn share).
    least_share: float
    p1_share: float

    def summary(self, config: SimConfig) -> str:
        waits = self.waits_s
        return (
            f"{config.sessions} sessions, capacity {config.capacity:g}/s, bound {config.bound_s:g} s: admitted"
            f" {self.admitted} after the warm-up, {self.throughput:.0f} turns/s; shed {self.sheds}; queue wait s p50"
            f" {waits.get('p50', 0):.2f} p99 {waits.get('p99', 0):.2f} max {waits.get('max', 0):.2f};"
            f" {self.within_bound:.1%} within the bound; turns a session: least {self.least_share:.2f} of the mean,"
            f" p1 {self.p1_share:.2f}"
        )


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _simulate(config: SimConfig) -> SimResult:
    rng = random.Random(config.seed)
    clock = _Clock()
    gate = FairAdmission(
        AdmissionConfig(
            max_active=config.limit, max_wait_s=config.bound_s, half_life_s=30.0, tag_span_turns=config.tag_span_turns
        ),
        clock=clock,
    )
    service_s = config.limit / config.capacity
    events: list[tuple[float, int, str, int, FairSlot | None]] = []
    order = itertools.count()

    def at(when: float, kind: str, session: int, slot: FairSlot | None = None) -> None:
        heapq.heappush(events, (when, next(order), kind, session, slot))

    def service() -> float:
        phase = 1.0 + config.swing * (1 if int(clock.now / 5) % 2 else -1)
        left = 1.0 - config.fall * min(clock.now / config.duration_s, 1.0)
        return service_s * rng.lognormvariate(0.0, config.jitter) * phase / max(left, 1e-3)

    def think() -> float:  # no think time: every session always wants a turn
        return rng.expovariate(1 / config.think_time_s) if config.think_time_s > 0 else 0.0

    for session in range(config.sessions):
        at(think(), "arrive", session)
    queued: dict[asyncio.Task[FairSlot], tuple[int, float]] = {}
    waits: list[float] = []
    turns = [0] * config.sessions
    sheds = 0
    # Each session's place in its conversation, from a random one: the load test's sessions start together, but
    # fall out of step within a few conversations.
    sent = [rng.randrange(max(config.conversation_turns, 1)) for _ in range(config.sessions)]

    def cost(session: int) -> int:
        if not config.conversation_turns:
            return 300
        return 60 + 32 * (sent[session] % config.conversation_turns)

    def started() -> None:
        for task, (session, arrived) in list(queued.items()):
            if task.done():
                del queued[task]
                if arrived >= config.warmup_s:
                    waits.append(clock.now - arrived)
                if clock.now >= config.warmup_s:
                    turns[session] += 1
                at(clock.now + service(), "end", session, task.result())

    while events and events[0][0] < config.duration_s:
        clock.now, _, kind, session, slot = heapq.heappop(events)
        if kind == "arrive":
            task = asyncio.ensure_future(gate.enter("tenant", f"s{session}", cost(session)))
            for _ in range(3):  # let the task run to its wait or its end
                await asyncio.sleep(0)
            if task.done() and isinstance(task.exception(), RateLimited | Saturated):
                sheds += 1
                error = task.exception()
                assert isinstance(error, RateLimited | Saturated)
                at(clock.now + error.retry_after_s + rng.uniform(0.0, config.late_s), "arrive", session)
                continue
            queued[task] = (session, clock.now)
        else:
            assert slot is not None
            slot.release(cost(session))
            sent[session] += 1
            for _ in range(3):
                await asyncio.sleep(0)
            at(clock.now + think(), "arrive", session)
        started()
    for task in queued:
        task.cancel()
    measured = max(config.duration_s - config.warmup_s, 1e-9)
    mean_turns = max(sum(turns) / len(turns), 1e-9)
    shares = sorted(n / mean_turns for n in turns)
    return SimResult(
        admitted=len(waits),
        sheds=sheds,
        throughput=len(waits) / measured,
        waits_s=percentiles(waits),
        within_bound=sum(1 for wait in waits if wait <= config.bound_s) / max(len(waits), 1),
        least_share=shares[0],
        p1_share=shares[len(shares) // 100],
    )


def simulate(config: SimConfig) -> SimResult:
    return asyncio.run(_simulate(config))


def _flag(field: str) -> str:
    return "--" + field.removesuffix("_s").replace("_", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    defaults = SimConfig()
    for field in dataclasses.fields(SimConfig):  # one flag a field: --think-time for think_time_s, ...
        default = getattr(defaults, field.name)
        parser.add_argument(_flag(field.name), dest=field.name, type=type(default), default=default)
    config = SimConfig(**vars(parser.parse_args(argv)))
    print(simulate(config).summary(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
