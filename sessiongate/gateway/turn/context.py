"""One turn while it is being served (`TurnContext`), and how it ends: `finish_turn` records a successful turn,
`fail_turn` a failed or cancelled one. Both release the turn's admission slot, charging the tokens it used.

Its own module because both the chat handler (`chat.py`) and the stream relay (`relay.py`) end turns, and the
handler opens the relay: neither may import the other's module back.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import anyio
import structlog

from sessiongate import sessions
from sessiongate.gateway.errors import WorkerUnreachable
from sessiongate.gateway.observability.tracing import NO_TURN, TurnTrace
from sessiongate.gateway.state import GatewayState

from .admission import FairSlot
from .assembly import TurnResult, as_dict
from .idempotency import Claim, completion_body
from .limits import Admission

__all__ = ["TurnContext", "fail_turn", "finish_turn", "now", "record_failure"]

log = structlog.get_logger(__name__)


# Tries to record a finished turn while the store is unavailable (0.25 s, 0.5 s, 1 s apart).
_RECORD_ATTEMPTS = 4


def now() -> datetime:
    return datetime.now(UTC)


class TurnContext:
    """Everything known about one turn while it is being served."""

    def __init__(
        self,
        *,
        state: GatewayState,
        tenant_id: str,
        session_id: str,
        turn_id: str,
        worker_id: str,
        received_at: datetime,
        started: float,
        client_wants_usage: bool,
        client_wants_cache_report: bool,
        admission: Admission | None = None,
        slot: FairSlot | None = None,
        idempotency: Claim | None = None,
        trace: TurnTrace = NO_TURN,
    ) -> None:
        self.state = state
        self.tenant_id = tenant_id
        self.session_id = session_id
        self.turn_id = turn_id
        self.worker_id = worker_id
        self.received_at = received_at
        self.started = started
        self.dispatched_at: datetime | None = None
        self.first_token_at: datetime | None = None
        self.client_wants_usage = client_wants_usage
        self.client_wants_cache_report = client_wants_cache_report
        self.admission = admission
        self.slot = slot
        self.idempotency = idempotency
        self.trace = trace

    def headers(self) -> dict[str, str]:
        return {
            "x-session-id": self.session_id,
            "x-sessiongate-turn-id": self.turn_id,
            "x-sessiongate-worker": self.worker_id,
        }

    def annotation(self) -> dict[str, str]:
        return {"session_id": self.session_id, "turn_id": self.turn_id, "worker": self.worker_id}


async def finish_turn(ctx: TurnContext, result: TurnResult) -> None:
    """Record a successful turn; a store failure here is logged, never shown to the client."""
    ended_at = now()
    state = ctx.state
    usage = result.usage or {}
    ctx.trace.upstream_end(usage=usage)
    total = usage.get("total_tokens")
    if ctx.slot is not None:  # the next waiting turn may start
        ctx.slot.release(total if isinstance(total, int) else None)
    if ctx.admission is not None:
        await state.sharing.charge(ctx.admission, total if isinstance(total, int) else 0)
        ctx.admission.release()
    prompt_details = as_dict(usage.get("prompt_tokens_details"))
    state.router.after_turn(ctx.session_id, ctx.worker_id, result.usage, result.cached_tokens_details)
    await state.sharing.after_turn(ctx.session_id)  # replicas: the next turn may land on another one
    tool_names = [str(as_dict(c.get("function")).get("name")) for c in result.message.get("tool_calls") or ()]
    state.advisor.on_turn_end(
        ctx.session_id, ctx.tenant_id, ctx.turn_id, cache_details=result.cached_tokens_details, tool_names=tool_names
    )
    state.metrics.count_turn("ok", ctx.worker_id)
    state.metrics.turn_latency.observe(time.perf_counter() - ctx.started)
    state.metrics.record_prompt_sources(
        usage.get("prompt_tokens"), result.cached_tokens_details, prompt_details.get("cached_tokens")
    )
    # The answer exists only in memory now: a store that is briefly unavailable (SQLite busy, pool exhausted)
    # gets a few more tries before the turn is left pending (and failed at the next start-up).
    with ctx.trace.span("sessiongate.store.end_turn"):
        await _record_success(ctx, result, ended_at)
    ctx.trace.end("ok", cached_tokens=result.cached_tokens_details)
    if ctx.idempotency is not None:
        answer = completion_body(ctx.turn_id, ctx.received_at, result, ctx.annotation())
        await ctx.idempotency.complete(ctx.turn_id, answer, ctx.headers())


async def _record_success(ctx: TurnContext, result: TurnResult, ended_at: datetime) -> None:
    state = ctx.state
    for attempt in range(_RECORD_ATTEMPTS):
        try:
            await state.store.complete_turn(
                ctx.turn_id,
                output_message=result.message,
                finish_reason=result.finish_reason,
                model=result.model,
                usage=result.usage,
                cached_tokens_details=result.cached_tokens_details,
                first_token_at=ctx.first_token_at,
                ended_at=ended_at,
                worker=ctx.worker_id,
                dispatched_at=ctx.dispatched_at,
            )
            break
        except sessions.StoreUnavailable as exc:
            if attempt + 1 == _RECORD_ATTEMPTS:
                log.error("turn_not_recorded", error=str(exc), status="ok", attempts=_RECORD_ATTEMPTS)
            else:
                await anyio.sleep(0.25 * 2**attempt)
        except sessions.StoreError as exc:
            log.error("turn_not_recorded", error=str(exc), status="ok")
            break


async def fail_turn(
    ctx: TurnContext,
    error: Exception,
    *,
    status: str = "failed",
    partial: dict[str, Any] | None = None,
    used_tokens: int = 0,
) -> None:
    """Record a failed or cancelled turn. `used_tokens`: what the worker spent on it before it ended (a streamed
    turn cut short), charged to the tenant like a finished turn's usage."""
    if ctx.slot is not None:
        ctx.slot.release(used_tokens)
    if ctx.admission is not None:
        await ctx.state.sharing.charge(ctx.admission, used_tokens)
        ctx.admission.release()
    if ctx.idempotency is not None:
        await ctx.idempotency.release()
    if isinstance(error, WorkerUnreachable):
        ctx.state.workers.report_unreachable(ctx.worker_id, error.message)
    ctx.state.advisor.on_turn_end(ctx.session_id, ctx.tenant_id, ctx.turn_id, cache_details=None)
    ctx.state.metrics.count_turn(status, ctx.worker_id)
    ctx.trace.upstream_end(error=error)
    with ctx.trace.span("sessiongate.store.end_turn"):
        await record_failure(
            ctx.state,
            ctx.turn_id,
            error,
            ended_at=now(),
            status=status,
            partial=partial,
            first_token_at=ctx.first_token_at,
            worker=ctx.worker_id,
            dispatched_at=ctx.dispatched_at,
        )
    ctx.trace.end(status, error=error)


async def record_failure(
    state: GatewayState,
    turn_id: str,
    error: Exception,
    *,
    ended_at: datetime,
    status: str = "failed",
    partial: dict[str, Any] | None = None,
    first_token_at: datetime | None = None,
    worker: str | None = None,
    dispatched_at: datetime | None = None,
) -> None:
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    try:
        await state.store.fail_turn(
            turn_id,
            status=status,
            error_type=type(error).__name__,
            error_message=message,
            ended_at=ended_at,
            partial_output=partial,
            first_token_at=first_token_at,
            worker=worker,
            dispatched_at=dispatched_at,
        )
    except sessions.StoreError as exc:
        log.error("turn_not_recorded", error=str(exc), status=status)
    log.info("turn_failed", status=status, error_type=type(error).__name__, error=message)
