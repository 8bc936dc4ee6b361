"""The resources hanging off a client: `client.sessions` and `client.chat.completions`, sync and async.

Each method is three lines of I/O around the shared pieces: a request builder from `_endpoints.py`, the
client's retrying `_request`, and a parser from `_types.py` / `_session_types.py`.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from . import _endpoints as ep
from ._base import parse_response
from ._endpoints import AdviseKind, Messages, ToolChoice, Tools, TypingState
from ._session import AsyncSession, Session
from ._session_types import (
    SessionClosed,
    SessionDeleted,
    SessionPage,
    SignalResult,
    ToolResultReceipt,
    Turn,
    parse_closed,
    parse_deleted,
    parse_session,
    parse_session_page,
    parse_signal,
    parse_tool_result,
    parse_turn,
)
from ._streaming import AsyncChatStream, ChatStream, OnComplete
from ._types import ChatCompletion, parse_completion

if TYPE_CHECKING:
    import httpx

    from ._client import AsyncSessionGate, SessionGate

__all__ = ["AsyncChat", "AsyncCompletions", "AsyncSessions", "Chat", "Completions", "Sessions"]


def _parse_messages(payload: Any) -> builtins.list[dict[str, Any]]:
    return [dict(m) for m in ep.parse_list(payload)]


def _parse_turns(payload: Any) -> builtins.list[Turn]:
    return [parse_turn(t) for t in ep.parse_list(payload)]


def _completion_of(response: httpx.Response, on_complete: OnComplete | None) -> ChatCompletion:
    completion = parse_response(response, lambda payload: parse_completion(payload, response.headers))
    if on_complete is not None:
        on_complete(completion)
    return completion


class Sessions:
    """`client.sessions`: create, get, list and delete gateway sessions; read their messages and turns; send the
    signals that let the gateway prefetch a session's KV before its next turn (typing, tool results, hints)."""

    def __init__(self, client: SessionGate) -> None:
        self._client = client

    def create(
        self, *, session_id: str | None = None, priority: int = 0, metadata: Mapping[str, Any] | None = None
    ) -> Session:
        info = self._client._request_parsed(ep.create_session(session_id, priority, metadata), parse_session)
        return Session(self._client, info)

    def get(self, session_id: str) -> Session:
        """The session with its context messages loaded."""
        info = self._client._request_parsed(ep.get_session(session_id), parse_session)
        return Session(self._client, info, self.messages(session_id))

    def list(self, *, limit: int = 20, after: str | None = None) -> SessionPage:
        return self._client._request_parsed(ep.list_sessions(limit, after), parse_session_page)

    def delete(self, session_id: str) -> SessionDeleted:
        return self._client._request_parsed(ep.delete_session(session_id), parse_deleted)

    def fork(
        self,
        session_id: str,
        *,
        at_turn: int | None = None,
        child_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Session:
        """A new session sharing this one's context (and its cached KV) up to turn `at_turn` (all of it by default),
        with that context loaded as its messages."""
        info = self._client._request_parsed(ep.fork_session(session_id, at_turn, child_id, metadata), parse_session)
        return Session(self._client, info, self.messages(info.id))

    def close(self, session_id: str) -> SessionClosed:
        """End the session (later turns are refused) and free its KV on every worker."""
        return self._client._request_parsed(ep.close_session(session_id), parse_closed)

    def messages(self, session_id: str) -> builtins.list[dict[str, Any]]:
        return self._client._request_parsed(ep.list_messages(session_id), _parse_messages)

    def turns(self, session_id: str) -> builtins.list[Turn]:
        return self._client._request_parsed(ep.list_turns(session_id), _parse_turns)

    def typing(self, session_id: str, state: TypingState = "started") -> SignalResult:
        return self._client._request_parsed(ep.typing(session_id, state), parse_signal)

    def tool_result(self, session_id: str, tool_call_id: str, content: str) -> ToolResultReceipt:
        options = ep.post_tool_result(session_id, tool_call_id, content)
        return self._client._request_parsed(options, parse_tool_result)

    def advise(
        self, session_id: str, *, kind: AdviseKind = "explicit", expected_in_ms: int | None = None
    ) -> SignalResult:
        return self._client._request_parsed(ep.advise(session_id, kind, expected_in_ms), parse_signal)


class AsyncSessions:
    """`client.sessions` of `AsyncSessionGate`."""

    def __init__(self, client: AsyncSessionGate) -> None:
        self._client = client

    async def create(
        self, *, session_id: str | None = None, priority: int = 0, metadata: Mapping[str, Any] | None = None
    ) -> AsyncSession:
        options = ep.create_session(session_id, priority, metadata)
        return AsyncSession(self._client, await self._client._request_parsed(options, parse_session))

    async def get(self, session_id: str) -> AsyncSession:
        """The session with its context messages loaded."""
        info = await self._client._request_parsed(ep.get_session(session_id), parse_session)
        return AsyncSession(self._client, info, await self.messages(session_id))

    async def list(self, *, limit: int = 20, after: str | None = None) -> SessionPage:
        return await self._client._request_parsed(ep.list_sessions(limit, after), parse_session_page)

    async def delete(self, session_id: str) -> SessionDeleted:
        return await self._client._request_parsed(ep.delete_session(session_id), parse_deleted)

    async def fork(
        self,
        session_id: str,
        *,
        at_turn: int | None = None,
        child_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> AsyncSession:
        """A new session sharing this one's context (and its cached KV) up to turn `at_turn` (all of it by default),
        with that context loaded as its messages."""
        request = ep.fork_session(session_id, at_turn, child_id, metadata)
        info = await self._client._request_parsed(request, parse_session)
        return AsyncSession(self._client, info, await self.messages(info.id))

    async def close(self, session_id: str) -> SessionClosed:
        """End the session (later turns are refused) and free its KV on every worker."""
        return await self._client._request_parsed(ep.close_session(session_id), parse_closed)

    async def messages(self, session_id: str) -> builtins.list[dict[str, Any]]:
        return await self._client._request_parsed(ep.list_messages(session_id), _parse_messages)

    async def turns(self, session_id: str) -> builtins.list[Turn]:
        return await self._client._request_parsed(ep.list_turns(session_id), _parse_turns)

    async def typing(self, session_id: str, state: TypingState = "started") -> SignalResult:
        return await self._client._request_parsed(ep.typing(session_id, state), parse_signal)

    async def tool_result(self, session_id: str, tool_call_id: str, content: str) -> ToolResultReceipt:
        options = ep.post_tool_result(session_id, tool_call_id, content)
        return await self._client._request_parsed(options, parse_tool_result)

    async def advise(
        self, session_id: str, *, kind: AdviseKind = "explicit", expected_in_ms: int | None = None
    ) -> SignalResult:
        return await self._client._request_parsed(ep.advise(session_id, kind, expected_in_ms), parse_signal)


class Completions:
    """`client.chat.completions`: the OpenAI-shaped call, without history keeping."""

    def __init__(self, client: SessionGate) -> None:
        self._client = client

    @overload
    def create(
        self,
        *,
        messages: Messages,
        session_id: str | None = ...,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[False] = ...,
        **extra: Any,
    ) -> ChatCompletion: ...
    @overload
    def create(
        self,
        *,
        messages: Messages,
        session_id: str | None = ...,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[True],
        **extra: Any,
    ) -> ChatStream: ...
    @overload
    def create(
        self,
        *,
        messages: Messages,
        session_id: str | None = ...,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: bool,
        **extra: Any,
    ) -> ChatCompletion | ChatStream: ...
    def create(
        self,
        *,
        messages: Messages,
        session_id: str | None = None,
        model: str | None = None,
        tools: Tools | None = None,
        tool_choice: ToolChoice | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stream: bool = False,
        **extra: Any,
    ) -> ChatCompletion | ChatStream:
        body = ep.build_chat_body(
            messages,
            model=model,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            extra=extra,
        )
        return self._send(body, session_id=session_id)

    def _send(
        self, body: Mapping[str, Any], *, session_id: str | None, on_complete: OnComplete | None = None
    ) -> ChatCompletion | ChatStream:
        options = ep.chat_completion(body, session_id)
        response = self._client._request(options)
        if options.stream:
            return ChatStream(response, on_complete=on_complete)
        return _completion_of(response, on_complete)


class AsyncCompletions:
    """`client.chat.completions` of `AsyncSessionGate`."""

    def __init__(self, client: AsyncSessionGate) -> None:
        self._client = client

    @overload
    async def create(
        self,
        *,
        messages: Messages,
        session_id: str | None = ...,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[False] = ...,
        **extra: Any,
    ) -> ChatCompletion: ...
    @overload
    async def create(
        self,
        *,
        messages: Messages,
        session_id: str | None = ...,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[True],
        **extra: Any,
    ) -> AsyncChatStream: ...
    @overload
    async def create(
        self,
        *,
        messages: Messages,
        session_id: str | None = ...,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: bool,
        **extra: Any,
    ) -> ChatCompletion | AsyncChatStream: ...
    async def create(
        self,
        *,
        messages: Messages,
        session_id: str | None = None,
        model: str | None = None,
        tools: Tools | None = None,
        tool_choice: ToolChoice | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stream: bool = False,
        **extra: Any,
    ) -> ChatCompletion | AsyncChatStream:
        body = ep.build_chat_body(
            messages,
            model=model,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            extra=extra,
        )
        return await self._send(body, session_id=session_id)

    async def _send(
        self, body: Mapping[str, Any], *, session_id: str | None, on_complete: OnComplete | None = None
    ) -> ChatCompletion | AsyncChatStream:
        options = ep.chat_completion(body, session_id)
        response = await self._client._request(options)
        if options.stream:
            return AsyncChatStream(response, on_complete=on_complete)
        return _completion_of(response, on_complete)


class Chat:
    """`client.chat`, holding `completions` as in openai-python."""

    def __init__(self, client: SessionGate) -> None:
        self.completions = Completions(client)


class AsyncChat:
    def __init__(self, client: AsyncSessionGate) -> None:
        self.completions = AsyncCompletions(client)
