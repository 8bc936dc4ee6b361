"""Pool page deletions run off the scheduler's thread, in the order they were asked for.

A drop deletes one page file per page of the session (a 128k-token context: 2,000 `unlink`s, ~50 ms here), and a
no-keep request's settle its own pages: on the scheduler's thread that time was taken from every running request's
next step, without bound. `PoolJanitor.submit(job)` queues the job (`pool_pages.pool_page_deletion`'s file-system part)
on one thread of its own and returns a ticket at once; `outcome(ticket)` answers, without waiting, the hashes whose
pages went once the job is done (None while it runs). A drop's reply carries its ticket, and the HTTP process asks
the scheduler for the outcome until it is done (`endpoints`): the scheduler's thread never waits for the pool.
Unlike `pool_probe.PoolProbe` (a question whose answer may be skipped), a deletion is never dropped: jobs queue
behind one another.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["KEPT_OUTCOMES", "PoolJanitor"]

KEPT_OUTCOMES = 1024
"""Outcomes nobody asked for are forgotten past this many tickets (a caller that gave up)."""


class PoolJanitor:
    """One background thread for pool deletions (scheduler thread only calls it)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sessiongate-pool-janitor")
        self._jobs: OrderedDict[str, Future[set[str]]] = OrderedDict()
        self._tickets = itertools.count(1)

    def submit(self, job: Callable[[], set[str]]) -> str:
        ticket = f"d{next(self._tickets)}"
        self._jobs[ticket] = self._executor.submit(job)
        while len(self._jobs) > KEPT_OUTCOMES:
            self._jobs.popitem(last=False)
        return ticket

    def outcome(self, ticket: str) -> set[str] | None:
        """The hashes whose pages the ticket's job deleted, once it is done (then forgotten); None while it runs.

        A job that raised, or a ticket unknown or forgotten, answers an empty set."""
        future = self._jobs.get(ticket)
        if future is None:
            return set()
        if not future.done():
            return None
        del self._jobs[ticket]
        return future.result() if future.exception() is None else set()

    def close(self) -> None:
        self._executor.shutdown(wait=False)
