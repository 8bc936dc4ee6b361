"""One advisory's prefetch, from the store to the worker's KV: the advisor's one long-running worker call.

`Prefetcher.run` reads the session's context (its messages, the tools of its last turn, its priority), asks the
advisory's worker to prefetch it (or, for a tool call's retain, to keep it where it is: `ToolLifecycle.retain`),
polls the prefetch while the advisory is still the session's live one, and when it is done records where the
KV now is: on the advisory (`ready_at`, `bytes_loaded`), in the shared state, in the statistics, and in the
router's KV belief (published to the other replicas). A prefetch that ends any other way marks the advisory
failed. Errors from the store or the worker propagate to the advisor, which marks the advisory failed.

The advisor owns one `Prefetcher`; the clocks are the advisor's, read through callables (tests swap the
advisor's clock on a running gateway).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from sessiongate import sessions
from sessiongate.gateway.errors import UpstreamError
from sessiongate.gateway.observability.tracing import NO_TRACING, PrefetchTrace, Tracing
from sessiongate.gateway.routing.router import Router
from sessiongate.gateway.workers.extension import ExtensionClient
from sessiongate.sglang_ext.protocol import MAX_EXPECTED_IN_MS, PrefetchRequest

from .core import LiveAdvisory, prefetch_residency
from .replicas import LocalAdvisories
from .stats import AdvisoryStats
from .tool_lifecycle import ToolLifecycle

__all__ = ["TERMINAL_STATES", "Prefetcher"]

log = structlog.get_logger(__name__)

# A prefetch's states after which its status no longer changes.
TERMINAL_STATES = ("done", "cancelled", "failed", "expired")
# A turn's pages reach the pool in the background after it ends (HiCache write-through). A prefetch on another
# worker within this long of that turn's end waits for them, up to `AWAIT_POOL_MS`, rather than read an older
# prefix of the context (a hint sent the instant a turn ends: a typing hint as the answer renders, a tool result).
RECENT_TURN_S = 10.0
AWAIT_POOL_MS = 3000


class Prefetcher:
    def __init__(
        self,
        *,
        store: sessions.SessionStore,
        extension: ExtensionClient,
        router: Router,
        stats: AdvisoryStats,
        replicas: LocalAdvisories,
        tools: ToolLifecycle,
        cache_salt_for: Callable[[str], str] | None,
        poll_interval_s: float,
        clock: Callable[[], float],
        unix: Callable[[], float],
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self.store = store
        self.extension = extension
        self.router = router
        self.stats = stats
        self.replicas = replicas
        self.tools = tools
        # The tenant's cache salt is part of every KV key: a prefetch without the salt the real request
        # carries would bring pages the request can never hit.
        self.cache_salt_for = cache_salt_for
        self.poll_interval_s = poll_interval_s
        self.clock = clock
        self.unix = unix
        self.tracing = tracing

    async def run(self, advisory: LiveAdvisory, *, live: Callable[[], bool]) -> None:
        """Prefetch the advisory's session to its worker; polling stops once `live()` is false (the advisory was
        claimed by a turn, withdrawn or replaced). Traced (tracing on) as its own trace, which the turn that claims
        the advisory links to."""
        with self.tracing.prefetch(
            advisory_id=advisory.id, session_id=advisory.session_id, kind=advisory.kind, worker_id=advisory.worker_id
        ) as trace:
            advisory.trace = trace.context
            await self._run(advisory, live, trace)

    async def _run(self, advisory: LiveAdvisory, live: Callable[[], bool], trace: PrefetchTrace) -> None:
        session_id, tenant_id = advisory.session_id, advisory.tenant_id
        context = await self.store.session_context(session_id, tenant_id=tenant_id)
        if not context:
            advisory.ready_at = self.clock()  # nothing to bring: the reservation alone
            await self.replicas.update(advisory, ready_at=self.unix())
            return
        record = await self.store.get_session(session_id, tenant_id=tenant_id)
        tools = await self._last_tools(session_id, tenant_id, record.turn_count)
        if advisory.action == "retain" and await self.tools.retain(advisory, context, tools, record.priority):
            advisory.ready_at, advisory.bytes_loaded = self.clock(), 0  # ready where it is, nothing loaded
            return
        request = PrefetchRequest(
            session_id=session_id,
            messages=context,
            tools=tools,
            priority=record.priority,
            ttl_ms=max(int((advisory.expires_at - self.clock()) * 1000), 1),
            # Among live hints the worker keeps the one expected first (none given: it expects the request at once).
            expected_in_ms=None
            if advisory.expected_at is None
            else min(max(round((advisory.expected_at - self.clock()) * 1000), 0), MAX_EXPECTED_IN_MS),
            target="host" if advisory.target == "host" else "device",
            cache_salt=self.cache_salt_for(tenant_id) if self.cache_salt_for else None,
            await_pool_ms=self._await_pool_ms(session_id, advisory.worker_id),
        )
        url = advisory.worker_url or ""
        self.stats.prefetch_sent(request.target)
        sent_at = self.clock()
        accepted = await self.extension.prefetch(advisory.worker_id, url, request)
        advisory.prefetch_id, advisory.tokens = accepted.prefetch_id, accepted.tokens
        state, status = accepted.state, None
        while state not in TERMINAL_STATES and live():
            await asyncio.sleep(self.poll_interval_s)
            status = await self.extension.prefetch_status(advisory.worker_id, url, accepted.prefetch_id)
            state = status.state
        if state == "done":
            advisory.ready_at = ready_at = self.clock()
            if status is None:  # done on arrival: read what it brought
                status = await self.extension.prefetch_status(advisory.worker_id, url, accepted.prefetch_id)
            advisory.bytes_loaded = status.bytes_loaded
            await self.replicas.update(
                advisory, ready_at=ready_at - self.clock() + self.unix(), bytes_loaded=status.bytes_loaded
            )
            self.stats.prefetch_done(ready_at - sent_at, status.bytes_loaded)
            resident, tier = prefetch_residency(
                tokens=status.tokens,
                target=status.target,
                on_device=status.pages_on_device,
                in_host=status.pages_in_host,
                unavailable=status.pages_unavailable,
            )
            self.router.belief.after_prefetch(
                session_id, advisory.worker_id, tokens=resident, tier=tier, now=self.clock()
            )
            await self.router.publish_kv(session_id)
            trace.done(
                target=status.target,
                bytes_loaded=status.bytes_loaded,
                pages={
                    "device": status.pages_on_device,
                    "host": status.pages_in_host,
                    "unavailable": status.pages_unavailable,
                },
            )
            log.info(
                "prefetch_done",
                advisory_id=advisory.id,
                worker=advisory.worker_id,
                resident_tokens=resident,
                pages_on_device=status.pages_on_device,
                pages_in_host=status.pages_in_host,
                pages_unavailable=status.pages_unavailable,
            )
        elif state in TERMINAL_STATES:
            trace.failed(state)
            advisory.failed = True
            await self.replicas.update(advisory, failed=True)

    def _await_pool_ms(self, session_id: str, worker_id: str) -> int:
        """How long the worker should wait for the pool to hold the session's last turn (0: not recent, or it ran
        on this very worker, whose own tiers hold it)."""
        entry = self.router.belief.entry(session_id)
        if entry is None or entry.last_worker is None or entry.last_worker == worker_id:
            return 0
        observed = entry.workers.get(entry.last_worker)
        if observed is None or self.clock() - observed[2] > RECENT_TURN_S:
            return 0
        return AWAIT_POOL_MS

    async def cancel(self, advisory: LiveAdvisory) -> None:
        """Stop the advisory's prefetch on its worker; a worker that does not answer is only logged."""
        assert advisory.prefetch_id is not None
        assert advisory.worker_url is not None
        try:
            await self.extension.cancel_prefetch(advisory.worker_id, advisory.worker_url, advisory.prefetch_id)
        except UpstreamError as exc:
            log.debug("prefetch_cancel_failed", advisory_id=advisory.id, error=exc.message)

    async def _last_tools(self, session_id: str, tenant_id: str, turn_count: int) -> list[dict[str, Any]] | None:
        turns = await self.store.list_turns(session_id, tenant_id=tenant_id, after_seq=max(turn_count - 1, 0), limit=1)
        tools = turns[-1].request.get("tools") if turns else None
        return tools if isinstance(tools, list) and tools else None
