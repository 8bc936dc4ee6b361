"""The gateway's side of routing: builds the policy's views from its soft state, and keeps that state current.

`gateway.routing` is pure; this module is where its inputs come from: the worker pool (health, in-flight
counts, load reports), the KV belief, and the advisor's reservation for the session. The chat path and the
advisor both ask `Router.choose`, so an advisory prefetch goes where the next request would go now.

With replicas (`gateway.shared`, distributed) the KV belief of a session is copied to the shared state after each
turn and finished prefetch (`publish_kv`) and read back before each turn (`load_kv`), so the replica serving a
session's next turn knows what the replica that served the last one learned. What is copied is the session's
observations; each replica's shadow of the workers' LRU tiers (`KVBelief`'s capacity rule) holds only the turns it
served, so an observation another replica made ages by time here, and a worker's pressure from other replicas'
turns is not counted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from sessiongate.gateway.routing import KVBelief, Reservation, RouteRequest, RoutingPolicy, WorkerView
from sessiongate.gateway.shared import SharedKV, SharedState, SharedUnavailable
from sessiongate.gateway.workers.pool import WorkerPool

from .belief import SessionKV

__all__ = ["Router", "prompt_chars", "prompt_text"]

# A rough tokens-per-character ratio for estimating a prompt before any worker tokenises it.
_CHARS_PER_TOKEN = 4


def prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The request's messages as one string: what cache_aware matches and the token estimate counts."""
    return "".join(_prompt_parts(messages))


def prompt_chars(messages: Sequence[Mapping[str, Any]]) -> int:
    """`len(prompt_text(messages))` without building the text: a long agent conversation is hundreds of kilobytes,
    copied for every turn only to be counted. A plain text message (most of them) is counted at once."""
    total = 0
    for message in messages:
        content = message.get("content")
        if type(content) is str and not message.get("tool_calls"):
            total += len(str(message.get("role"))) + 2 + len(content)  # "<role>" and the text
        else:
            total += sum(map(len, _prompt_parts((message,))))
    return total


def _prompt_parts(messages: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    """The pieces `prompt_text` joins; a message's text content is yielded as it is, not copied."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        yield f"<{message.get('role')}>"
        yield content if isinstance(content, str) else str(content or "")
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict):
                yield str(call.get("function", {}))


class Router:
    def __init__(
        self,
        policy: RoutingPolicy,
        pool: WorkerPool,
        *,
        belief: KVBelief | None = None,
        stale_after_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedState | None = None,
        unix: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.pool = pool
        self.belief = belief or KVBelief()
        self.stale_after_s = stale_after_s
        self.clock = clock
        # The replicas' shared state, or None with one process (nothing to copy anywhere).
        self.shared = shared if shared is not None and shared.distributed else None
        self.unix = unix

    def candidates(self, *, exclude: Collection[str] = ()) -> list[WorkerView]:
        routable = self.pool.routable(now=self.clock(), stale_after_s=self.stale_after_s)
        return [w for w in routable if w.id not in exclude] if exclude else routable

    def route_request(
        self,
        session_id: str,
        tenant_id: str,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        known_prefix: int = 0,
        reservation: Reservation | None = None,
    ) -> RouteRequest:
        """`known_prefix`: how many of `messages` are the session's context as last served (the store's split of
        the request). Their tokens are the KV belief's count of that context, and only the messages after them are
        estimated from their characters: a long conversation is not counted again at every turn."""
        now = self.clock()
        text = prompt_text(messages) if getattr(self.policy, "matches_prompt_text", False) else ""
        context_tokens = self.belief.context_tokens(session_id)
        if text:
            prompt_tokens = max(len(text) // _CHARS_PER_TOKEN, context_tokens)
        elif known_prefix and context_tokens:
            prompt_tokens = context_tokens + prompt_chars(messages[known_prefix:]) // _CHARS_PER_TOKEN
        else:
            prompt_tokens = max(prompt_chars(messages) // _CHARS_PER_TOKEN, context_tokens)
        return RouteRequest(
            session_id=session_id,
            tenant_id=tenant_id,
            prompt_tokens=prompt_tokens,
            prompt_text=text,
            kv=self.belief.residency(session_id, now),
            reservation=reservation,
            now=now,
        )

    def choose(
        self,
        session_id: str,
        tenant_id: str,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        known_prefix: int = 0,
        reservation: Reservation | None = None,
        exclude: Collection[str] = (),
    ) -> WorkerView | None:
        """The policy's choice among routable workers not in `exclude`; None when there is none. `known_prefix`:
        as for `route_request`."""
        workers = self.candidates(exclude=exclude)
        if not workers:
            return None
        request = self.route_request(
            session_id, tenant_id, messages, known_prefix=known_prefix, reservation=reservation
        )
        return self.policy.choose(request, workers)

    def scores(
        self,
        session_id: str,
        tenant_id: str,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        known_prefix: int = 0,
        reservation: Reservation | None = None,
    ) -> dict[str, float]:
        """Each routable worker's score for this request, as the policy sees it (lower is better: kv_aware's expected
        seconds to first token, Dynamo's cost), or its requests in flight for a policy that scores nothing. Asked
        only by a traced turn, after `choose`: what the chosen worker beat."""
        workers = self.candidates()
        request = self.route_request(
            session_id, tenant_id, messages, known_prefix=known_prefix, reservation=reservation
        )
        for method in ("scores", "costs"):
            score = getattr(self.policy, method, None)
            if callable(score):
                return dict(score(request, workers))
        return {w.id: float(w.in_flight) for w in workers}

    def after_turn(
        self, session_id: str, worker_id: str, usage: Mapping[str, Any] | None, details: Mapping[str, Any] | None
    ) -> None:
        usage = usage or {}
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        worker = self.pool.get(worker_id)
        if worker is not None and worker.load is not None:
            # The capacities the belief counts the worker's LRU tiers against (a worker without a report: by time).
            self.belief.set_capacity(
                worker_id,
                device_tokens=worker.load.device_kv_tokens_total,
                host_tokens=worker.load.host_kv_tokens_total,
            )
        self.belief.after_turn(
            session_id,
            worker_id,
            prompt_tokens=prompt if isinstance(prompt, int) else 0,
            completion_tokens=completion if isinstance(completion, int) else 0,
            details=details,
            writes_to_pool=worker is not None and worker.load is not None and bool(worker.load.storage_backend),
            now=self.clock(),
        )

    # replicas

    def load_kv(self, session_id: str, kv: SharedKV | None) -> None:
        """Take the shared belief of the session (another replica may have served its last turn). None: the shared
        state has none (never written, or lost with Redis), and this replica's own stays."""
        if kv is None:
            return
        offset = self.clock() - self.unix()  # Unix seconds -> this process's monotonic clock
        self.belief.replace(
            session_id,
            SessionKV(
                workers={w: (tokens, tier, at + offset) for w, (tokens, tier, at) in kv.workers.items()},
                pool=kv.pool,
                last_worker=kv.last_worker,
                context_tokens=kv.context_tokens,
                last_report=dict(kv.last_report) if kv.last_report is not None else None,
            ),
        )

    async def publish_kv(self, session_id: str) -> None:
        """Copy this replica's belief of the session to the shared state (a failure leaves it here only)."""
        entry = self.belief.entry(session_id)
        if self.shared is None or entry is None:
            return
        offset = self.unix() - self.clock()
        kv = SharedKV(
            workers={w: (tokens, tier, at + offset) for w, (tokens, tier, at) in entry.workers.items()},
            pool=entry.pool,
            last_worker=entry.last_worker,
            context_tokens=entry.context_tokens,
            last_report=entry.last_report,
        )
        with contextlib.suppress(SharedUnavailable):  # unreachable: the next turn's replica routes by its own
            await self.shared.put_kv(session_id, kv, ttl_s=self.belief.host_ttl_s)

    async def drop_kv(self, session_id: str) -> None:
        """Forget the session's belief here and in the shared state (its KV was dropped everywhere)."""
        self.belief.after_drop(session_id)
        if self.shared is not None:
            with contextlib.suppress(SharedUnavailable):
                await self.shared.drop_kv(session_id)
