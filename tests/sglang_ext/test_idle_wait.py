"""The scheduler's idle wait: SGLang's own when nothing moves, a short poll of the same sockets while KV moves."""

from __future__ import annotations

from types import SimpleNamespace

from sessiongate.sglang_ext.internals import idle_wait


class FakeSleeper:
    """SGLang's IdleSleeper as far as the wrapper uses it: a zmq poller and `maybe_sleep`."""

    def __init__(self) -> None:
        self.polls: list[int] = []
        self.full_waits = 0
        self.poller = SimpleNamespace(poll=self.polls.append)

    def maybe_sleep(self) -> None:
        self.full_waits += 1


def test_waits_as_sglang_when_nothing_moves_and_polls_briefly_while_something_does() -> None:
    moving = [False]
    inner = FakeSleeper()
    scheduler = SimpleNamespace(idle_sleeper=inner)
    assert idle_wait.install(scheduler, lambda: moving[0])
    scheduler.idle_sleeper.maybe_sleep()
    assert (inner.full_waits, inner.polls) == (1, [])
    moving[0] = True
    scheduler.idle_sleeper.maybe_sleep()
    assert (inner.full_waits, inner.polls) == (1, [idle_wait.IN_FLIGHT_POLL_MS])


def test_leaves_schedulers_without_a_poller_alone() -> None:
    assert not idle_wait.install(SimpleNamespace(idle_sleeper=None), lambda: False)
    rust_sleeper = SimpleNamespace(maybe_sleep=lambda: None)  # the Rust server's parks on its ring, not zmq
    scheduler = SimpleNamespace(idle_sleeper=rust_sleeper)
    assert not idle_wait.install(scheduler, lambda: False)
    assert scheduler.idle_sleeper is rust_sleeper


def test_any_unacknowledged_copy_of_the_cache_counts_as_moving() -> None:
    empty = {name: {} for name in idle_wait._ONGOING}
    assert not idle_wait.cache_moves_in_flight(SimpleNamespace(**empty))
    assert not idle_wait.cache_moves_in_flight(SimpleNamespace())  # a cache without HiCache
    for name in idle_wait._ONGOING:
        assert idle_wait.cache_moves_in_flight(SimpleNamespace(**{**empty, name: {7: object()}}))
