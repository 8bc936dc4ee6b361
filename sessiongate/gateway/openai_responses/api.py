"""`/v1/responses`: OpenAI's Responses API, served as turns of sessions through the chat completions path.

A response chain is a session; each response is one of its turns. `create` reads the chain's context from the
store (the session's turns up to the previous response's turn), appends the request's input items as chat
messages, and hands the whole list to `chat.chat_completions` as the body of an internal chat request naming the
session: routing, advisories, tenancy, limits, idempotency and the turn's recording are the chat path's, and the
worker receives the same messages, token for token, as the turn before it cached. The answer is then translated
(`convert.py`, `stream.py`) and the response stored (`sessions.responses`). An unknown or another tenant's
`previous_response_id` is the same 404.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from sessiongate.gateway.api.auth import authenticate
from sessiongate.gateway.api.lifecycle import close_and_free
from sessiongate.gateway.api.responses import JSONBytesResponse
from sessiongate.gateway.api.schemas import parse_json, validate, validate_session_id
from sessiongate.gateway.errors import InvalidRequest
from sessiongate.gateway.state import GatewayState, gateway_state
from sessiongate.gateway.turn.chat import chat_completions
from sessiongate.gateway.turn.implicit import SESSION_HEADERS, SESSION_SOURCE_KEY

from .convert import chat_tool_choice, chat_tools, input_messages, new_id, output_items, response_object
from .schemas import ResponsesBody
from .stream import EventStream

__all__ = ["create_response", "delete_response", "get_response", "list_input_items"]

_CHAT_PATH = "/v1/chat/completions"
_DROPPED_HEADERS = frozenset({b"content-length", b"content-type", *(h.encode() for h in SESSION_HEADERS)})


def _refuse_unsupported(body: ResponsesBody) -> None:
    if body.background:
        raise InvalidRequest("Background responses are not supported by this gateway.", param="background")
    if body.conversation is not None:
        raise InvalidRequest("Conversations are not supported; use 'previous_response_id'.", param="conversation")


def _chat_body(body: ResponsesBody, messages: list[dict[str, Any]]) -> dict[str, Any]:
    chat: dict[str, Any] = {"messages": messages, "stream": body.stream}
    if body.model is not None:
        chat["model"] = body.model
    if body.temperature is not None:
        chat["temperature"] = body.temperature
    if body.top_p is not None:
        chat["top_p"] = body.top_p
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    tools = chat_tools(body.tools)
    if tools is not None:
        chat["tools"] = tools
        if body.tool_choice is not None:
            chat["tool_choice"] = chat_tool_choice(body.tool_choice)
        if body.parallel_tool_calls is not None:
            chat["parallel_tool_calls"] = body.parallel_tool_calls
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    return chat


def _chat_request(request: Request, session_id: str | None, source: str, chat: dict[str, Any]) -> Request:
    """The internal chat request: the client's headers (its key, an idempotency key), the session named (none:
    the chat path infers it or starts one), the chat body; after the body, `receive` is the client's (the relay
    watches it for a disconnect)."""
    raw = orjson.dumps(chat)
    headers = [(k, v) for k, v in request.scope["headers"] if k not in _DROPPED_HEADERS]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if session_id is not None:
        headers.append((b"x-session-id", session_id.encode()))
    scope = {
        **request.scope,
        "headers": headers,
        "path": _CHAT_PATH,
        "raw_path": _CHAT_PATH.encode(),
        SESSION_SOURCE_KEY: source,
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await request.receive()

    return Request(scope, receive)


async def create_response(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    raw = parse_json(await request.body())
    body = validate(ResponsesBody, raw)
    _refuse_unsupported(body)
    context: list[dict[str, Any]] = []
    session_id: str | None
    if body.previous_response_id is not None:
        previous, context = await state.store.response_context(body.previous_response_id, tenant_id=tenant_id)
        session_id, source = previous.session_id, "response"
        if previous.instructions and context[:1] == [{"role": "system", "content": previous.instructions}]:
            context = context[1:]  # a response's instructions are not carried over to the next one
    else:
        # Named by a header, or none: the chat path attaches the input to the session it extends, or starts one.
        session_id, source = _session_from_headers(request), "header"
    new_messages, items = input_messages(body.input)
    if not new_messages:
        raise InvalidRequest("'input' must hold at least one message or function call output.", param="input")
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat = _chat_body(body, [*system, *context, *new_messages])
    echoed = {**raw, "tool_choice": body.tool_choice, "store": body.store}
    response_id, created_at = new_id("resp_"), int(time.time())

    async def store(final: dict[str, Any], headers: dict[str, str]) -> None:
        """Annotate the final response with its turn, and store it (with `store: true`)."""
        final["sessiongate"] = {
            "session_id": headers.get("x-session-id") or session_id,
            "turn_id": headers.get("x-sessiongate-turn-id"),
            "worker": headers.get("x-sessiongate-worker"),
        }
        if body.store:
            await state.store.create_response(
                response_id,
                tenant_id=tenant_id,
                session_id=headers.get("x-session-id") or session_id or "",
                turn_id=headers["x-sessiongate-turn-id"],
                previous_response_id=body.previous_response_id,
                instructions=body.instructions,
                input_items=items,
                body=final,
            )

    inner = await chat_completions(_chat_request(request, session_id, source, chat))
    if inner.status_code != 200:
        return inner
    if body.stream:
        return EventStream(inner, response_id, echoed, created_at, store)
    return await _complete(state, inner, response_id, echoed, created_at, store)


def _session_from_headers(request: Request) -> str | None:
    for header in SESSION_HEADERS:
        value = request.headers.get(header)
        if value:
            return validate_session_id(value.strip(), param=header)
    return None


async def _complete(
    state: GatewayState, inner: Response, response_id: str, request: dict[str, Any], created_at: int, store: Any
) -> Response:
    answer = orjson.loads(inner.body)
    headers = {k.decode(): v.decode() for k, v in inner.raw_headers if k.startswith(b"x-")}
    choice = (answer.get("choices") or [{}])[0]
    final = response_object(
        response_id,
        request,
        status="completed",
        output=output_items(choice.get("message")),
        model=answer.get("model"),
        usage=answer.get("usage"),
        finish_reason=choice.get("finish_reason"),
        created_at=created_at,
    )
    await store(final, headers)
    return JSONBytesResponse(final, headers=headers)


async def get_response(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    record = await state.store.get_response(request.path_params["response_id"], tenant_id=tenant_id)
    return JSONResponse(record.body)


async def delete_response(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    record, last = await state.store.delete_response(request.path_params["response_id"], tenant_id=tenant_id)
    if last:  # the chain's last response: its session ends, and its KV is freed everywhere
        session = await state.store.get_session(record.session_id, tenant_id=tenant_id)
        if session.state == "active":
            await close_and_free(state, session)
    return JSONResponse({"id": record.id, "object": "response", "deleted": True})


async def list_input_items(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    record = await state.store.get_response(request.path_params["response_id"], tenant_id=tenant_id)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order")
    try:
        limit = int(request.query_params.get("limit", "20"))
    except ValueError:
        raise InvalidRequest("'limit' must be an integer.", param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequest("'limit' must be between 1 and 100.", param="limit")
    items = record.input_items if order == "asc" else list(reversed(record.input_items))
    after = request.query_params.get("after")
    if after is not None:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )
