"""Prefix breaks, seen and counted: a turn whose resent history does not extend its session's stored context.

The store decides "extends or not" by digest as it records the turn (`context_reset`); only on a turn that does not
(and has a context to break: not the session's first) does the gateway read the stored context back and find the
first difference (`sessions.prefix_breaks.find_break`): the turn records it (`prefix_break` in
`GET /v1/sessions/{id}/turns`, and in the chat page's table), the session counts it (the admin API lists sessions
by `min_prefix_breaks`), and `/metrics` counts it by kind (`sessiongate_prefix_breaks_total`). The read is one
query on a turn that is about to prefill most of its prompt again anyway; a store failure here is logged, never
shown to the client.

`PrefixBreakNotes` examines them beside the turns, not in their path, a few at a time. In the turn's path, a burst
of them (the load test's 1,000 sessions all start their conversations over within a second or two) held every
turn of the burst behind its read and took the event loop's CPU for seconds: throughput fell from about 1,100 to
230-580 turns/s for 3-4 s at a time, and the added latency's p99 went to 3.6-8.7 times its p50 (docs/benchmarks.md,
"The gateway's slow seconds").
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import structlog

from sessiongate import sessions
from sessiongate.gateway.observability.metrics import GatewayMetrics
from sessiongate.sessions.prefix_breaks import find_break

__all__ = ["PrefixBreakNotes"]

# Examined at once at most; the others wait their turn (each is one read and, for a break, one write).
NOTES_AT_ONCE = 2
# Waiting at most (each holds its request's messages): past it, a turn's reset is counted, not examined.
MAX_PENDING = 1_000
# At shutdown, how long the examinations under way may take to finish before the rest are dropped.
CLOSE_GRACE_S = 2.0

log = structlog.get_logger(__name__)


class PrefixBreakNotes:
    """The prefix breaks to examine, in the background: `note` returns at once; past `max_pending` waiting, a reset
    is counted (`sessiongate_prefix_breaks_unexamined_total`) instead; `aclose()` (the gateway's shutdown, before the
    store closes) lets those under way finish for `CLOSE_GRACE_S` and drops the rest."""

    def __init__(
        self,
        store: sessions.SessionStore,
        metrics: GatewayMetrics,
        *,
        at_once: int = NOTES_AT_ONCE,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._slots = asyncio.Semaphore(at_once)
        self._tasks: set[asyncio.Task[None]] = set()
        self.max_pending = max_pending

    def note(
        self, tenant_id: str, session_id: str, turn: sessions.TurnRecord, messages: Sequence[Mapping[str, Any]]
    ) -> None:
        if not turn.context_reset or turn.seq <= 1:
            return
        if len(self._tasks) >= self.max_pending:
            self._metrics.prefix_breaks_unexamined.inc()
            return
        examination = self._examine(tenant_id, session_id, turn, messages)
        task = asyncio.get_running_loop().create_task(self._when_free(examination))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _when_free(self, examination: Coroutine[Any, Any, None]) -> None:
        try:
            async with self._slots:
                await examination
        finally:
            examination.close()  # dropped while waiting (shutdown): never started, so never awaited

    async def _examine(
        self, tenant_id: str, session_id: str, turn: sessions.TurnRecord, messages: Sequence[Mapping[str, Any]]
    ) -> None:
        try:
            # The context as the turn found it: examined in the background, the turn may have ended and moved it.
            context = await self._store.session_context(session_id, tenant_id=tenant_id, before_seq=turn.seq)
            found = find_break(context, messages)
            if found is None:
                return
            self._metrics.prefix_breaks.labels(found.kind).inc()
            await self._store.record_prefix_break(turn.id, session_id=session_id, detail=found.as_dict())
            log.info("prefix_break", index=found.index, kind=found.kind, tokens_lost=found.tokens_lost)
        except sessions.StoreError as exc:
            log.warning("prefix_break_not_recorded", error=str(exc))

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def aclose(self) -> None:
        if not self._tasks:
            return
        _, late = await asyncio.wait(list(self._tasks), timeout=CLOSE_GRACE_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
