"""`Session` and `AsyncSession`: a conversation whose context the client keeps, one gateway session each.

`chat(messages)` takes the NEW messages of a turn, sends the whole context (`session.messages` plus the new
ones) with `X-Session-Id`, and only when the turn succeeds appends the new messages and the assistant's reply
to `session.messages`. A failed turn leaves the context as it was, so the caller can simply call again.
For a stream, "succeeds" means the stream was read to `[DONE]`. One turn at a time per session object.

Signals tell the gateway that the session's next turn is coming, so it can bring the session's KV to the worker
that will serve it before the turn arrives (an advisory prefetch): `typing("started")` when the user starts
typing, `tool_result(call_id, content)` when a tool the model called returns, `advise()` for any other hint.
Each returns what the advisor did (`SignalResult`); how the advisory ended shows on the turn
(`turn.advisory.outcome`: used, late, wasted, missed, cancelled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

from ._endpoints import AdviseKind, Messages, ToolChoice, Tools, TypingState, build_chat_body
from ._session_types import SessionClosed, SessionDeleted, SessionInfo, SignalResult, ToolResultReceipt, Turn
from ._streaming import AsyncChatStream, ChatStream, OnComplete
from ._types import ChatCompletion

if TYPE_CHECKING:
    from ._client import AsyncSessionGate, SessionGate

__all__ = ["AsyncSession", "Session"]


class _SessionBase:
    """The history keeping both session classes share; no I/O."""

    info: SessionInfo
    messages: list[dict[str, Any]]

    def __init__(self, info: SessionInfo, messages: Iterable[Mapping[str, Any]] = ()) -> None:
        self.info = info
        self.messages = [dict(m) for m in messages]

    @property
    def id(self) -> str:
        return self.info.id

    def _prepare_turn(
        self,
        new_messages: Messages,
        *,
        model: str | None,
        tools: Tools | None,
        tool_choice: ToolChoice | None,
        max_tokens: int | None,
        temperature: float | None,
        stream: bool,
        extra: Mapping[str, Any],
    ) -> tuple[dict[str, Any], OnComplete]:
        """The request body for a turn, and the callback that commits the turn to `messages` on success."""
        if isinstance(new_messages, Mapping):
            raise TypeError("messages must be a list of message dicts, not a single dict")
        new = [dict(m) for m in new_messages]
        body = build_chat_body(
            [*self.messages, *new],
            model=model,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            extra=extra,
        )

        def commit(completion: ChatCompletion) -> None:
            self.messages.extend(new)
            if completion.message is not None:
                self.messages.append(completion.message.to_dict())

        return body, commit

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, messages={len(self.messages)})"


class Session(_SessionBase):
    """A gateway session with client-side context; made by `client.sessions.create()` or `.get(id)`."""

    def __init__(self, client: SessionGate, info: SessionInfo, messages: Messages = ()) -> None:
        super().__init__(info, messages)
        self._client = client

    @overload
    def chat(
        self,
        messages: Messages,
        *,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[False] = ...,
        **extra: Any,
    ) -> ChatCompletion: ...
    @overload
    def chat(
        self,
        messages: Messages,
        *,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[True],
        **extra: Any,
    ) -> ChatStream: ...
    @overload
    def chat(
        self,
        messages: Messages,
        *,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: bool,
        **extra: Any,
    ) -> ChatCompletion | ChatStream: ...
    def chat(
        self,
        messages: Messages,
        *,
        model: str | None = None,
        tools: Tools | None = None,
        tool_choice: ToolChoice | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stream: bool = False,
        **extra: Any,
    ) -> ChatCompletion | ChatStream:
        """Send one turn (the NEW `messages`); extra keyword arguments go into the request body."""
        body, commit = self._prepare_turn(
            messages,
            model=model,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            extra=extra,
        )
        return self._client.chat.completions._send(body, session_id=self.id, on_complete=commit)

    def turns(self) -> list[Turn]:
        """The turns the gateway recorded for this session, oldest first."""
        return self._client.sessions.turns(self.id)

    def typing(self, state: TypingState = "started") -> SignalResult:
        """The user started (or stopped) typing: the gateway prefetches the session's KV for the coming turn."""
        return self._client.sessions.typing(self.id, state)

    def tool_result(self, tool_call_id: str, content: str) -> ToolResultReceipt:
        """A tool the model called returned: recorded on the call, and a hint that the next turn follows.

        Send the same result as the `role: "tool"` message of the next `chat` too: the model reads it there."""
        return self._client.sessions.tool_result(self.id, tool_call_id, content)

    def advise(self, *, kind: AdviseKind = "explicit", expected_in_ms: int | None = None) -> SignalResult:
        """An explicit hint that the next turn comes in about `expected_in_ms` (the prefetch is timed for it)."""
        return self._client.sessions.advise(self.id, kind=kind, expected_in_ms=expected_in_ms)

    def reload(self) -> None:
        """Replace `info` and `messages` with the gateway's current view of the session."""
        fresh = self._client.sessions.get(self.id)
        self.info, self.messages = fresh.info, fresh.messages

    def delete(self) -> SessionDeleted:
        return self._client.sessions.delete(self.id)

    def fork(self, *, at_turn: int | None = None, child_id: str | None = None) -> Session:
        """A new session sharing this one's context and its cached KV (up to turn `at_turn`; all by default)."""
        return self._client.sessions.fork(self.id, at_turn=at_turn, child_id=child_id)

    def close(self) -> SessionClosed:
        """End the session and free its KV on every worker (what each dropped is in the answer)."""
        closed = self._client.sessions.close(self.id)
        self.info = closed.info
        return closed


class AsyncSession(_SessionBase):
    """The async twin of `Session`."""

    def __init__(self, client: AsyncSessionGate, info: SessionInfo, messages: Messages = ()) -> None:
        super().__init__(info, messages)
        self._client = client

    @overload
    async def chat(
        self,
        messages: Messages,
        *,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[False] = ...,
        **extra: Any,
    ) -> ChatCompletion: ...
    @overload
    async def chat(
        self,
        messages: Messages,
        *,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: Literal[True],
        **extra: Any,
    ) -> AsyncChatStream: ...
    @overload
    async def chat(
        self,
        messages: Messages,
        *,
        model: str | None = ...,
        tools: Tools | None = ...,
        tool_choice: ToolChoice | None = ...,
        max_tokens: int | None = ...,
        temperature: float | None = ...,
        stream: bool,
        **extra: Any,
    ) -> ChatCompletion | AsyncChatStream: ...
    async def chat(
        self,
        messages: Messages,
        *,
        model: str | None = None,
        tools: Tools | None = None,
        tool_choice: ToolChoice | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stream: bool = False,
        **extra: Any,
    ) -> ChatCompletion | AsyncChatStream:
        """Send one turn (the NEW `messages`); extra keyword arguments go into the request body."""
        body, commit = self._prepare_turn(
            messages,
            model=model,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            extra=extra,
        )
        return await self._client.chat.completions._send(body, session_id=self.id, on_complete=commit)

    async def turns(self) -> list[Turn]:
        """The turns the gateway recorded for this session, oldest first."""
        return await self._client.sessions.turns(self.id)

    async def typing(self, state: TypingState = "started") -> SignalResult:
        """The user started (or stopped) typing: the gateway prefetches the session's KV for the coming turn."""
        return await self._client.sessions.typing(self.id, state)

    async def tool_result(self, tool_call_id: str, content: str) -> ToolResultReceipt:
        """A tool the model called returned: recorded on the call, and a hint that the next turn follows."""
        return await self._client.sessions.tool_result(self.id, tool_call_id, content)

    async def advise(self, *, kind: AdviseKind = "explicit", expected_in_ms: int | None = None) -> SignalResult:
        """An explicit hint that the next turn comes in about `expected_in_ms` (the prefetch is timed for it)."""
        return await self._client.sessions.advise(self.id, kind=kind, expected_in_ms=expected_in_ms)

    async def reload(self) -> None:
        """Replace `info` and `messages` with the gateway's current view of the session."""
        fresh = await self._client.sessions.get(self.id)
        self.info, self.messages = fresh.info, fresh.messages

    async def delete(self) -> SessionDeleted:
        return await self._client.sessions.delete(self.id)

    async def fork(self, *, at_turn: int | None = None, child_id: str | None = None) -> AsyncSession:
        """A new session sharing this one's context and its cached KV (up to turn `at_turn`; all by default)."""
        return await self._client.sessions.fork(self.id, at_turn=at_turn, child_id=child_id)

    async def close(self) -> SessionClosed:
        """End the session and free its KV on every worker (what each dropped is in the answer)."""
        closed = await self._client.sessions.close(self.id)
        self.info = closed.info
        return closed
