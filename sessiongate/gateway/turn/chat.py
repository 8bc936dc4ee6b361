"""`POST /v1/chat/completions`: one session turn, recorded before and after it goes to a worker.

The order matters for "nothing the user sent is lost": the turn (with the request's new messages) is committed
as `pending` before any worker sees it; the answer, or the failure, is written when it ends. A turn whose
recording fails after the worker answered is still answered; the store marks it failed at the next start-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
import structlog
from starlette.requests import Request
from starlette.responses import Response

from sessiongate import sessions
from sessiongate.gateway.api.auth import authenticate
from sessiongate.gateway.api.responses import JSONBytesResponse
from sessiongate.gateway.api.schemas import ChatRequest, new_session_id, parse_json, validate_chat, validate_session_id
from sessiongate.gateway.errors import (
    InvalidRequest,
    ServiceUnavailable,
    UpstreamError,
    WorkerRejected,
    WorkerUnreachable,
)
from sessiongate.gateway.observability.tracing import NO_TURN, TurnTrace
from sessiongate.gateway.state import GatewayState, gateway_state
from sessiongate.sglang_ext.protocol import KEEP_HEADER, NO_KEEP_RID_PREFIX

from .admission import FairSlot, estimate_cost
from .assembly import attach_cache_details, result_from_response
from .bounds import check_chat_bounds
from .context import TurnContext, fail_turn, finish_turn, now, record_failure
from .idempotency import Claim, claim_idempotency
from .implicit import SESSION_HEADERS, SESSION_SOURCE_KEY, infer_session
from .limits import Admission
from .relay import StreamRelay

__all__ = ["chat_completions"]

log = structlog.get_logger(__name__)

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


def _session_id(request: Request, body: dict[str, Any]) -> tuple[str | None, str]:
    """The session the request names and how ("header", "body"); (None, "") when it names none."""
    for header in SESSION_HEADERS:
        value = request.headers.get(header)
        if value:
            return validate_session_id(value.strip(), param=header), request.scope.get(SESSION_SOURCE_KEY, "header")
    from_body = body.get("session_id")
    if from_body is not None:
        if not isinstance(from_body, str):
            raise InvalidRequest("'session_id' must be a string.", param="session_id")
        return validate_session_id(from_body, param="session_id"), "body"
    return None, ""


# Request fields only the gateway sets: `priority` ranks the turn's KV in the worker's cache (it comes from the
# session, bounded per tenant), `rid` names the request on the worker (the gateway uses it to mark a no-keep turn;
# a client's rid could also collide with another tenant's running request). They are refused, not silently
# overridden: a client that sends them believes it controls something it does not.
_GATEWAY_PARAMS = ("priority", "rid")


def _refuse_gateway_params(body: dict[str, Any]) -> None:
    for name in _GATEWAY_PARAMS:
        if name in body:
            hint = " Set the session's priority instead (POST/PATCH /v1/sessions)." if name == "priority" else ""
            raise InvalidRequest(f"'{name}' is set by the gateway and may not be sent.{hint}", param=name)


def _upstream_body(body: dict[str, Any], chat: ChatRequest, cache_salt: str, priority: int) -> dict[str, Any]:
    upstream = {k: v for k, v in body.items() if k != "session_id"}
    upstream["cache_salt"] = cache_salt  # the tenant's, always: a client cannot choose another tenant's cache
    upstream["priority"] = priority  # the session's (see _GATEWAY_PARAMS)
    upstream["return_cached_tokens_details"] = True
    if chat.stream:
        upstream["stream_options"] = {**(chat.stream_options or {}), "include_usage": True}
    return upstream


async def chat_completions(request: Request) -> Response:
    state = gateway_state(request)
    received_at, started = now(), time.perf_counter()
    # Tracing off, this check is all the turn pays for it: NO_TURN's methods are empty.
    trace = state.tracing.turn(request.headers.get("traceparent")) if state.tracing.enabled else NO_TURN
    try:
        with trace.span("sessiongate.admission"):
            tenant_id = await authenticate(request, state.settings)
            admission = await state.sharing.admit(tenant_id)
    except BaseException as exc:
        trace.end("rejected", error=exc)
        raise
    guards = _Guards(admission)
    try:
        return await _chat_turn(request, state, tenant_id, guards, received_at, started, trace)
    except BaseException as exc:
        # A streamed turn releases them when it ends (finish_turn / fail_turn); releasing twice is harmless.
        with anyio.CancelScope(shield=True):
            await guards.abandon()
        trace.end("failed", error=exc)  # a no-op when fail_turn ended it already
        raise


@dataclass
class _Guards:
    """What a turn holds until it ends: its tenant's admission, its slot in the fair queue once it has one, and its
    idempotency key when it has one."""

    admission: Admission
    slot: FairSlot | None = None
    claim: Claim | None = None

    async def abandon(self) -> None:
        self.admission.release()
        if self.slot is not None:
            self.slot.release(0)
        if self.claim is not None:
            await self.claim.release()


async def _chat_turn(
    request: Request,
    state: GatewayState,
    tenant_id: str,
    guards: _Guards,
    received_at: datetime,
    started: float,
    trace: TurnTrace,
) -> Response:
    raw = await request.body()
    body = parse_json(raw)
    chat = validate_chat(body)
    check_chat_bounds(chat, state.settings)
    _refuse_gateway_params(body)
    session_id, source = _session_id(request, body)
    if session_id is None:  # implicit sessions (gateway/turn/implicit.py)
        session_id = await infer_session(state.store, tenant_id, body["messages"])
        session_id, source = (session_id, "inferred") if session_id is not None else (new_session_id(), "new")
    structlog.contextvars.bind_contextvars(session_id=session_id)
    # The fair queue (gateway/turn/admission.py): waits for a slot, or refuses the turn at once; nothing is stored yet.
    with trace.span("sessiongate.queue"):
        guards.slot = await state.admission.enter(
            tenant_id, session_id, estimate_cost(len(raw), chat.max_tokens or chat.max_completion_tokens)
        )
    claim = await claim_idempotency(
        request,
        state.store,
        tenant_id=tenant_id,
        body=body,
        session_headers=[request.headers.get(h) for h in SESSION_HEADERS],
        holder=sessions.IdempotencyHolder(instance=state.instance, run=state.run),
        stale_after_s=state.settings.upstream_read_timeout_s,
        lease_s=state.settings.instance_lease_s,
        late_writes=state.idempotency_writes,
    )
    if isinstance(claim, Response):
        guards.admission.release()
        guards.slot.release(0)
        trace.end("replayed")
        return claim  # a retry of a finished request: its first answer
    guards.claim = claim

    try:
        with trace.span("sessiongate.store.begin_turn"):
            turn = await state.store.begin_turn(
                session_id,
                tenant_id=tenant_id,
                create_session=True,
                messages=body["messages"],
                request={k: body[k] for k in _RECORDED_PARAMS if k in body},
                received_at=received_at,
                gateway_instance=state.instance,
                gateway_run=state.run,
                session_source=source,
            )
    except sessions.SessionExists:
        # Another tenant's session: answer exactly as for an id that does not exist.
        raise sessions.SessionNotFound(session_id) from None
    structlog.contextvars.bind_contextvars(turn_id=turn.id)
    trace.identify(session_id, turn.id)
    state.prefix_breaks.note(tenant_id, session_id, turn, body["messages"])

    await state.sharing.before_routing(session_id)  # replicas: claim the session's advisory, read its KV belief
    reservation = state.advisor.reservation(session_id)
    messages = body["messages"]
    known_prefix = 0 if turn.context_reset else len(messages) - len(turn.input_messages)
    with trace.span("sessiongate.route") as route_span:
        worker = state.router.choose(
            session_id, tenant_id, messages, known_prefix=known_prefix, reservation=reservation
        )
        if trace.recording and worker is not None:
            scores = state.router.scores(
                session_id, tenant_id, messages, known_prefix=known_prefix, reservation=reservation
            )
            trace.routed(route_span, worker.id, state.policy.name, scores)
    if worker is None:
        error = ServiceUnavailable(
            "No healthy worker is available; the turn was recorded as failed.", code="no_healthy_worker"
        )
        await record_failure(state, turn.id, error, ended_at=now())
        raise error
    foreseen = state.advisor.on_request(session_id, tenant_id, turn.id, turn.seq, worker.id)
    if foreseen is not None and trace.recording:
        trace.link_advisory(foreseen.advisory.trace)
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
        slot=guards.slot,
        idempotency=claim,
        trace=trace,
    )
    upstream = _upstream_body(body, chat, state.salts.for_tenant(tenant_id), turn.session_priority)
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
            ctx.trace.upstream_end(error=exc)
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
    with state.workers.lease(ctx.worker_id) as worker:
        ctx.dispatched_at = now()
        traceparent = ctx.trace.upstream_start(ctx.worker_id)
        lost = f"Worker {ctx.worker_id} became unreachable before it answered (its health checks cannot connect)."
        with state.workers.abort_if_lost(ctx.worker_id, lost):
            answer = await state.worker_client.chat(ctx.worker_id, url, upstream, traceparent=traceparent)
        worker.last_progress = time.monotonic()
    result = result_from_response(answer)
    await finish_turn(ctx, result)
    if isinstance(answer.get("usage"), dict):
        attach_cache_details(answer["usage"], result.cached_tokens_details)
    if not ctx.client_wants_cache_report:
        answer.pop("sglext", None)
    answer["sessiongate"] = ctx.annotation()
    return JSONBytesResponse(answer, headers=ctx.headers())
