"""The gateway's side of routing: builds the policy's views from its soft state, and keeps that state current.

`gateway.routing` is pure; this module is where its inputs come from: the worker pool (health, in-flight
counts, load reports), the KV belief, and the advisor's reservation for the session. The chat path and the
advisor both ask `Router.choose`, so an advisory prefetch goes where the next request would go now.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .routing import KVBelief, Reservation, RouteRequest, RoutingPolicy, WorkerView
from .workers import WorkerPool

__all__ = ["Router", "prompt_text"]

# A rough tokens-per-character ratio for estimating a prompt before any worker tokenises it.
_CHARS_PER_TOKEN = 4


def prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The request's messages as one string: what cache_aware matches and the token estimate counts."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<{message.get('role')}>{content or ''}")
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict):
                parts.append(str(call.get("function", {})))
    return "".join(parts)


class Router:
    def __init__(
        self,
        policy: RoutingPolicy,
        pool: WorkerPool,
        *,
        belief: KVBelief | None = None,
        stale_after_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.pool = pool
        self.belief = belief or KVBelief()
        self.stale_after_s = stale_after_s
        self.clock = clock

    def candidates(self, *, exclude: Collection[str] = ()) -> list[WorkerView]:
        return [
            w for w in self.pool.routable(now=self.clock(), stale_after_s=self.stale_after_s) if w.id not in exclude
        ]

    def route_request(
        self,
        session_id: str,
        tenant_id: str,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        reservation: Reservation | None = None,
    ) -> RouteRequest:
        now = self.clock()
        text = prompt_text(messages)
        return RouteRequest(
            session_id=session_id,
            tenant_id=tenant_id,
            prompt_tokens=max(len(text) // _CHARS_PER_TOKEN, self.belief.context_tokens(session_id)),
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
        reservation: Reservation | None = None,
        exclude: Collection[str] = (),
    ) -> WorkerView | None:
        """The policy's choice among routable workers not in `exclude`; None when there is none."""
        workers = self.candidates(exclude=exclude)
        if not workers:
            return None
        return self.policy.choose(self.route_request(session_id, tenant_id, messages, reservation=reservation), workers)

    def after_turn(
        self, session_id: str, worker_id: str, usage: Mapping[str, Any] | None, details: Mapping[str, Any] | None
    ) -> None:
        usage = usage or {}
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        worker = self.pool.get(worker_id)
        self.belief.after_turn(
            session_id,
            worker_id,
            prompt_tokens=prompt if isinstance(prompt, int) else 0,
            completion_tokens=completion if isinstance(completion, int) else 0,
            details=details,
            writes_to_pool=worker is not None and worker.load is not None and bool(worker.load.storage_backend),
            now=self.clock(),
        )
