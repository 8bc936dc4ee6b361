"""`POST /v1/chat/completions`: one session turn, recorded before and after it goes to a worker.

The order matters for "nothing the user sent is lost": the turn (with the request's new messages) is committed
as `pending` before any worker sees it; the answer, or the failure, is written when it ends. A turn whose
recording fails after the worker answered is still answered; the store marks it failed at the next start-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import sessions
from sglang_ext.protocol import KEEP_HEADER, NO_KEEP_RID_PREFIX

from .assembly import TurnResult, as_dict, attach_cache_details, result_from_response
from .auth import authenticate
from .bounds import check_chat_bounds
from .errors import InvalidRequest, ServiceUnavailable, UpstreamError, WorkerRejected, WorkerUnreachable
from .idempotency import Claim, claim_idempotency, completion_body
from .limits import Admission
from .relay import StreamRelay
from .schemas import ChatCompletionBody, new_session_id, parse_json, validate, validate_session_id
from .state import GatewayState, gateway_state

__all__ = ["TurnContext", "chat_completions", "finish_turn"]

log = structlog.get_logger(__name__)

# Where clients may name the session, in order of precedence (the body's `session_id` comes after them).
SESSION_HEADERS = ("x-session-id", "x-session-affinity", "x-smg-routing-key")
# Request fields that describe the turn in the store (messages are stored separately, as a delta).
_RECORDED_PARAMS = (
    "model",
    "stream",
    "tools",
    "tool_choice",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "response_format",
)


# Tries to record a finished turn while the store is unavailable (0.25 s, 0.5 s, 1 s apart).
_RECORD_ATTEMPTS = 4


def _now() -> datetime:
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
        idempotency: Claim | None = None,
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
        self.idempotency = idempotency

    def headers(self) -> dict[str, str]:
        return {
            "x-session-id": self.session_id,
            "x-sessiongate-turn-id": self.turn_id,
            "x-sessiongate-worker": self.worker_id,
        }

    def annotation(self) -> dict[str, str]:
        return {"session_id": self.session_id, "turn_id": self.turn_id, "worker": self.worker_id}


def _session_id(request: Request, body: dict[str, Any]) -> str:
    for header in SESSION_HEADERS:
        value = request.headers.get(header)
        if value:
            return validate_session_id(value.strip(), param=header)
    from_body = body.get("session_id")
    if from_body is not None:
        if not isinstance(from_body, str):
            raise InvalidRequest("'session_id' must be a string.", param="session_id")
        return validate_session_id(from_body, param="session_id")
    return new_session_id()


def _upstream_body(body: dict[str, Any], chat: ChatCompletionBody, cache_salt: str) -> dict[str, Any]:
    upstream = {k: v for k, v in body.items() if k != "session_id"}
    upstream["cache_salt"] = cache_salt  # the tenant's, always: a client cannot choose another tenant's cache
    upstream["return_cached_tokens_details"] = True
    if chat.stream:
        upstream["stream_options"] = {**(chat.stream_options or {}), "include_usage": True}
    return upstream


async def chat_completions(request: Request) -> Response:
    state = gateway_state(request)
    received_at, started = _now(), time.perf_counter()
    tenant_id = await authenticate(request, state.settings)
    guards = _Guards(state.limits.admit(tenant_id))
    try:
        return await _chat_turn(request, state, tenant_id, guards, received_at, started)
    except BaseException:
        # A streamed turn releases them when it ends (finish_turn / fail_turn); releasing twice is harmless.
        with anyio.CancelScope(shield=True):
            await guards.abandon()
        raise


@dataclass
class _Guards:
    """What a turn holds until it ends: its tenant's admission, and its idempotency key when it has one."""

    admission: Admission
    claim: Claim | None = None

    async def abandon(self) -> None:
        self.admission.release()
        if self.claim is not None:
            await self.claim.release()


async def _chat_turn(
    request: Request,
    state: GatewayState,
    tenant_id: str,
    guards: _Guards,
    received_at: datetime,
    started: float,
) -> Response:
    body = parse_json(await request.body())
    chat = validate(ChatCompletionBody, body)
    check_chat_bounds(chat, state.settings)
    session_id = _session_id(request, body)
    structlog.contextvars.bind_contextvars(session_id=session_id)
    claim = await claim_idempotency(
        request,
        state.store,
        tenant_id=tenant_id,
        body=body,
        session_headers=[request.headers.get(h) for h in SESSION_HEADERS],
        stale_after_s=state.settings.upstream_read_timeout_s,
    )
    if isinstance(claim, Response):
        guards.admission.release()
        return claim  # a retry of a finished request: its first answer
    guards.claim = claim

    try:
        turn = await state.store.begin_turn(
            session_id,
            tenant_id=tenant_id,
            create_session=True,
            messages=body["messages"],
            request={k: body[k] for k in _RECORDED_PARAMS if k in body},
            received_at=received_at,
            gateway_instance=state.instance,
            gateway_run=state.run,
        )
    except sessions.SessionExists:
        # Another tenant's session: answer exactly as for an id that does not exist.
        raise sessions.SessionNotFound(session_id) from None
    structlog.contextvars.bind_contextvars(turn_id=turn.id)

    reservation = state.advisor.reservation(session_id)
    worker = state.router.choose(session_id, tenant_id, body["messages"], reservation=reservation)
    if worker is None:
        error = ServiceUnavailable(
            "No healthy worker is available; the turn was recorded as failed.", code="no_healthy_worker"
        )
        await _record_failure(state, turn.id, error, ended_at=_now())
        raise error
    state.advisor.on_request(session_id, tenant_id, turn.id, turn.seq, worker.id)
    ctx = TurnContext(
        state=state,
        tenant_id=tenant_id,
        session_id=session_id,
        turn_id=turn.id,
        worker_id=worker.id,
        received_at=received_at,
        started=started,
        client_wants_usage=bool((chat.stream_options or {}).get("include_usage")),
        client_wants_cache_report=bool(body.get("return_cached_tokens_details")),
        admission=guards.admission,
        idempotency=claim,
    )
    upstream = _upstream_body(body, chat, state.salts.for_tenant(tenant_id))
    if request.headers.get(KEEP_HEADER, "").strip().lower() == "false":
        upstream["rid"] = f"{NO_KEEP_RID_PREFIX}{turn.id}"  # the worker keeps none of this turn's own KV
    return await _dispatch(ctx, worker.url, upstream, stream=chat.stream)


async def _dispatch(ctx: TurnContext, url: str, upstream: dict[str, Any], *, stream: bool) -> Response:
    """Send the turn; a worker that fails before its first byte is replaced once by the router's next choice
    (the client has seen nothing yet, so the turn stays one turn)."""
    tried = {ctx.worker_id}
    while True:
        try:
            if stream:
                return await StreamRelay(ctx, url, upstream).open()
            return await _complete(ctx, url, upstream)
        except UpstreamError as exc:
            retryable = isinstance(exc, WorkerUnreachable) or (
                isinstance(exc, WorkerRejected) and exc.status_code >= 500
            )
            other = ctx.state.router.choose(ctx.session_id, ctx.tenant_id, exclude=tried) if retryable else None
            if other is None or len(tried) > 1:
                await fail_turn(ctx, exc)
                raise
            log.warning("turn_retried", failed_worker=ctx.worker_id, worker=other.id, error=exc.message)
            ctx.worker_id, url = other.id, other.url
            tried.add(other.id)


async def _complete(ctx: TurnContext, url: str, upstream: dict[str, Any]) -> Response:
    state = ctx.state
    with state.workers.lease(ctx.worker_id):
        ctx.dispatched_at = _now()
        answer = await state.worker_client.chat(ctx.worker_id, url, upstream)
    result = result_from_response(answer)
    await finish_turn(ctx, result)
    if isinstance(answer.get("usage"), dict):
        attach_cache_details(answer["usage"], result.cached_tokens_details)
    if not ctx.client_wants_cache_report:
        answer.pop("sglext", None)
    answer["sessiongate"] = ctx.annotation()
    return JSONResponse(answer, headers=ctx.headers())


async def finish_turn(ctx: TurnContext, result: TurnResult) -> None:
    """Record a successful turn; a store failure here is logged, never shown to the client."""
    ended_at = _now()
    state = ctx.state
    usage = result.usage or {}
    if ctx.admission is not None:
        total = usage.get("total_tokens")
        ctx.admission.charge(total if isinstance(total, int) else 0)
        ctx.admission.release()
    prompt_details = as_dict(usage.get("prompt_tokens_details"))
    state.router.after_turn(ctx.session_id, ctx.worker_id, result.usage, result.cached_tokens_details)
    tool_names = [str(as_dict(c.get("function")).get("name")) for c in result.message.get("tool_calls") or ()]
    state.advisor.on_turn_end(
        ctx.session_id, ctx.tenant_id, ctx.turn_id, cache_details=result.cached_tokens_details, tool_names=tool_names
    )
    state.metrics.turns.labels("ok", ctx.worker_id).inc()
    state.metrics.turn_latency.observe(time.perf_counter() - ctx.started)
    state.metrics.record_prompt_sources(
        usage.get("prompt_tokens"), result.cached_tokens_details, prompt_details.get("cached_tokens")
    )
    # The answer exists only in memory now: a store that is briefly unavailable (SQLite busy, pool exhausted)
    # gets a few more tries before the turn is left pending (and failed at the next start-up).
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
    if ctx.idempotency is not None:
        answer = completion_body(ctx.turn_id, ctx.received_at, result, ctx.annotation())
        await ctx.idempotency.complete(ctx.turn_id, answer, ctx.headers())


async def fail_turn(
    ctx: TurnContext, error: Exception, *, status: str = "failed", partial: dict[str, Any] | None = None
) -> None:
    if ctx.admission is not None:
        ctx.admission.release()
    if ctx.idempotency is not None:
        await ctx.idempotency.release()
    if isinstance(error, WorkerUnreachable):
        ctx.state.workers.report_unreachable(ctx.worker_id, error.message)
    ctx.state.advisor.on_turn_end(ctx.session_id, ctx.tenant_id, ctx.turn_id, cache_details=None)
    ctx.state.metrics.turns.labels(status, ctx.worker_id).inc()
    await _record_failure(
        ctx.state,
        ctx.turn_id,
        error,
        ended_at=_now(),
        status=status,
        partial=partial,
        first_token_at=ctx.first_token_at,
        worker=ctx.worker_id,
        dispatched_at=ctx.dispatched_at,
    )


async def _record_failure(
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
