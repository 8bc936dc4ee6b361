"""A typing hint's prefetch is timed by when its tenant's turns usually follow their first typing signal
(advisor/typing_gaps.py): learnt on the real app against fake workers speaking the extension, with the advisor's
clock faked."""

from __future__ import annotations

from typing import Any

import pytest

from sessiongate.gateway.advisor.typing_gaps import TypingGaps

from .conftest import Gateway
from .test_signals import FAST, USER, _advisories, _turn, eventually
from .test_toolkv import _fake_clock

ANSWER = {"role": "assistant", "content": "Start with Alfama."}
NEXT = {"role": "user", "content": "and on day two?"}


def test_the_gap_is_learnt_from_the_first_signal_and_expected_at_a_low_quantile() -> None:
    gaps = TypingGaps(quantile=0.25)
    for session, gap in (("a", 4.0), ("b", 8.0), ("c", 12.0)):
        assert gaps.started(session, "t1", now=100.0) is None  # nothing learnt yet: fire at once
        gaps.started(session, "t1", now=101.0)  # a repeated signal keeps the first one's time
        gaps.turn_began(session, now=100.0 + gap)
    assert gaps.started("d", "t1", now=200.0) == pytest.approx(6.0)  # the 25th percentile of 4, 8 and 12
    assert gaps.started("d", "t1", now=203.0) == pytest.approx(3.0)  # from the first signal, never pushed later
    assert gaps.started("d", "t1", now=210.0) == 0.0  # overdue: expected now
    assert gaps.started("e", "t2", now=200.0) is None  # per tenant
    gaps.turn_began("never-typed", now=300.0)  # a turn with no typing signal teaches nothing
    assert gaps.gaps.quantile("t1\x00later", 0.5) == pytest.approx(8.0)


def test_signals_that_came_with_the_answer_are_learnt_apart_from_those_that_came_later() -> None:
    """A signal at the answer's end expects the turn a think time away; one that came later, a typing time
    away. Mixed, the 25th percentile (a think time) fired the typing-time hints' prefetches seconds early."""
    gaps = TypingGaps(quantile=0.25)
    for i in range(4):  # with the answer: the turns came 2 s after
        gaps.turn_ended(f"quick-{i}", now=100.0)
        gaps.started(f"quick-{i}", "t1", now=100.5)
        gaps.turn_began(f"quick-{i}", now=102.5)
    for i in range(4):  # 20 s after the answer: the turns came 11 s after the signal
        gaps.turn_ended(f"reader-{i}", now=100.0)
        gaps.started(f"reader-{i}", "t1", now=120.0)
        gaps.turn_began(f"reader-{i}", now=131.0)
    gaps.turn_ended("next-quick", now=200.0)
    assert gaps.started("next-quick", "t1", now=200.2) == pytest.approx(2.0)
    gaps.turn_ended("next-reader", now=200.0)
    assert gaps.started("next-reader", "t1", now=230.0) == pytest.approx(11.0)
    assert gaps.started("no-turn-seen", "t1", now=230.0) == pytest.approx(11.0)  # a session unknown here: later


async def _typed_turn(gw: Gateway, clock: Any, session: str, gap_s: float) -> str:
    """A turn, a typing signal, and `gap_s` later the next turn; returns the signal's state."""
    first = await _turn(gw, session, [USER])
    typing = await gw.client.post(f"/v1/sessions/{session}/typing", json={"state": "started"})
    assert typing.status_code == 202, typing.text
    clock.now += gap_s
    await _turn(gw, session, [USER, {"role": "assistant", "content": first["choices"][0]["message"]["content"]}, NEXT])
    state: str = typing.json()["state"]
    return state


def _prefetches(gw: Gateway, session: str) -> list[Any]:
    return [p["request"] for w in gw.workers.values() for p in w.prefetches.values() if p["session_id"] == session]


@pytest.mark.anyio
async def test_once_learnt_a_typing_hint_fires_its_prefetch_a_lead_before_the_turn_usually_comes(
    make_gateway: Any,
) -> None:
    async with make_gateway(**{**FAST, "advisory_ttl_s": 30.0, "advisory_typing_timed": True}) as gw:
        clock = _fake_clock(gw)
        # Three sessions whose turns came 6 s after their users started typing: fired at once, nothing learnt yet.
        assert [await _typed_turn(gw, clock, f"learn-{i}", 6.0) for i in range(3)] == ["fired"] * 3

        await _turn(gw, "timed", [USER])
        typing = (await gw.client.post("/v1/sessions/timed/typing", json={"state": "started"})).json()
        assert typing["state"] == "scheduled"  # not fired yet
        (advisory,) = await _advisories(gw, "timed")
        assert advisory.detail["expected_in_ms"] == 6000
        # The lead before the expected turn: the context's load time and a margin, at least advisory_lead_s (1 s).
        clock.now += 6.0 - 1.0 - 0.1
        await _turn(gw, "other", [USER])  # time passes for the advisor's tick too
        assert not _prefetches(gw, "timed")

        clock.now += 0.2
        await eventually(lambda: _has_prefetch(gw, "timed"))
        (sent,) = _prefetches(gw, "timed")
        assert sent.expected_in_ms == pytest.approx(900, abs=5)  # the worker ranks its pages by it


async def _has_prefetch(gw: Gateway, session: str) -> bool:
    return bool(_prefetches(gw, session))


@pytest.mark.anyio
async def test_by_default_a_typing_hint_fires_at_once(make_gateway: Any) -> None:
    # Timing is off by default: in the simulator it cost p99 TTFT on chat (docs/simulator.md).
    async with make_gateway(**FAST) as gw:
        clock = _fake_clock(gw)
        assert [await _typed_turn(gw, clock, f"off-{i}", 6.0) for i in range(3)] == ["fired"] * 3
        await _turn(gw, "at-once", [USER])
        typing = (await gw.client.post("/v1/sessions/at-once/typing", json={"state": "started"})).json()
        assert typing["state"] == "fired"
        await eventually(lambda: _has_prefetch(gw, "at-once"))
