"""The fair queue's active limit follows the event loop's lag (gateway/turn/loop_lag.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from sessiongate.gateway.turn.admission import AdmissionConfig, FairAdmission
from sessiongate.gateway.turn.loop_lag import LoopLagLimiter

pytestmark = pytest.mark.anyio


@dataclass
class Gate:
    """What the limiter steers, as `FairAdmission` exposes it."""

    active: int
    waiting: int
    limit: int

    def set_limit(self, limit: int) -> None:
        self.limit = limit


def test_a_lagging_loop_lowers_the_limit_down_to_the_floor() -> None:
    gate = Gate(active=100, waiting=50, limit=100)
    limiter = LoopLagLimiter(gate, target_s=0.02, ceiling=100, floor=8)
    limits = []
    for _ in range(40):
        limiter.observe(0.2)
        limits.append(gate.limit)
    assert limits[0] == 90  # the average (0.3 x 0.2 s) passes the target at the first tick
    assert limits == sorted(limits, reverse=True)
    assert gate.limit == 8


def test_a_quiet_loop_raises_a_limit_in_use_back_to_the_ceiling() -> None:
    gate = Gate(active=20, waiting=30, limit=20)
    limiter = LoopLagLimiter(gate, target_s=0.02, ceiling=64, floor=8)
    for _ in range(200):
        limiter.observe(0.001)
        gate.active = gate.limit  # the queue fills every slot it is given
    assert gate.limit == 64


def test_a_limit_not_in_use_is_not_raised() -> None:
    # Nothing waits: a higher limit would change nothing now and overshoot when the load comes.
    gate = Gate(active=3, waiting=0, limit=20)
    limiter = LoopLagLimiter(gate, target_s=0.02, ceiling=64, floor=8)
    for _ in range(50):
        limiter.observe(0.0)
    assert gate.limit == 20


def test_one_long_callback_moves_the_limit_less_than_a_lag_that_lasts() -> None:
    once, lasting = Gate(active=64, waiting=10, limit=64), Gate(active=64, waiting=10, limit=64)
    spike, steady = (
        LoopLagLimiter(once, target_s=0.02, ceiling=64, floor=8),
        LoopLagLimiter(lasting, target_s=0.02, ceiling=64, floor=8),
    )
    for tick in range(10):
        spike.observe(0.05 if tick == 0 else 0.001)
        steady.observe(0.05)
    assert once.limit > lasting.limit


def test_a_floor_above_the_ceiling_is_refused() -> None:
    with pytest.raises(ValueError, match="floor"):
        LoopLagLimiter(Gate(0, 0, 4), target_s=0.02, ceiling=4, floor=8)


async def test_a_raised_limit_starts_waiting_turns_at_once() -> None:
    admission = FairAdmission(AdmissionConfig(max_active=1, max_wait_s=0, half_life_s=30))
    first = await admission.enter("t", "a", 10)
    waiting = [asyncio.create_task(admission.enter("t", s, 10)) for s in ("b", "c")]
    await asyncio.sleep(0)
    assert (admission.active, admission.waiting) == (1, 2)
    admission.set_limit(3)
    slots = await asyncio.wait_for(asyncio.gather(*waiting), 1)
    assert (admission.active, admission.waiting) == (3, 0)
    admission.set_limit(1)  # lowered: the active turns run on; no new one starts until they are under it
    late = asyncio.create_task(admission.enter("t", "d", 10))
    await asyncio.sleep(0.01)
    assert not late.done()
    for slot in (first, *slots):
        slot.release(10)
    await asyncio.wait_for(late, 1)


async def test_the_limiter_measures_a_blocked_loop() -> None:
    gate = Gate(active=50, waiting=10, limit=50)
    limiter = LoopLagLimiter(gate, target_s=0.02, ceiling=50, floor=4, interval_s=0.01)
    task = asyncio.create_task(limiter.run())
    try:
        await asyncio.sleep(0.05)
        for _ in range(5):
            time.sleep(0.08)  # noqa: ASYNC251 (a callback that holds the loop, as a saturated gateway's do)
            await asyncio.sleep(0.015)
        assert limiter.lag_s > 0.02
        assert gate.limit < 50
    finally:
        task.cancel()
