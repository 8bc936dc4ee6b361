"""Questions to the shared KV pool asked off the scheduler's thread, with a bound on how long it waits.

The scheduler thread runs every forward; a pool call on it (an existence check of a session's pages for
`retain`) costs a file-system round trip per page on the `file` pool and a network round trip on Mooncake, and
~4 s when the Mooncake master is gone. `PoolProbe.ask(question)` runs the question on one thread of its own and
waits at most `wait_s`; past that the caller gets None (unknown) and the question finishes in the background.
While one question is still running, the next one is not queued behind it: it is answered None at once.
`submit` asks without waiting at all: the caller looks at the future on a later iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

__all__ = ["DEFAULT_WAIT_S", "PoolProbe"]

DEFAULT_WAIT_S = 0.05
Answer = TypeVar("Answer")


class PoolProbe:
    """One background thread for pool questions; `ask` blocks for at most `wait_s`."""

    def __init__(self, wait_s: float = DEFAULT_WAIT_S) -> None:
        self._wait_s = wait_s
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sessiongate-pool-probe")
        self._running: Future[object] | None = None

    def ask(self, question: Callable[[], Answer]) -> Answer | None:
        if self._running is not None and not self._running.done():
            return None  # the pool has not answered the last question yet: do not queue behind it
        future = self._executor.submit(question)
        self._running = future  # type: ignore[assignment]
        try:
            return future.result(timeout=self._wait_s)
        except FutureTimeout:
            return None

    def submit(self, question: Callable[[], Answer]) -> Future[Answer]:
        """Ask on the probe's thread and return at once (behind any question still running)."""
        return self._executor.submit(question)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
