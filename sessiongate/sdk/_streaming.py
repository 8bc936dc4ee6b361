"""Chat streams: SSE decoding, chunk assembly, and the sync and async stream objects.

`SSEDecoder` (in `_sse.py`, shared with the benchmarks and the tests) turns lines into server-sent events;
`ChunkAssembler` folds chunks into one `ChatCompletion` (content concatenated, tool calls merged by index, the
last usage and gateway ids kept); `StreamDecoder` drives both and applies the gateway's stream rules:
`data: [DONE]` ends the stream, `data: {"error": ...}` raises `APIError`, and a stream that closes before
`[DONE]` raises `APIConnectionError`. `ChatStream` and `AsyncChatStream` are only the I/O edge around a
`StreamDecoder`. A stream is never retried once it started.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

from ._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    connection_error_from,
    error_body,
    error_message,
)
from ._sse import ServerSentEvent, SSEDecoder
from ._types import ChatCompletion, ChatCompletionChunk, parse_chunk, parse_completion

__all__ = [
    "AsyncChatStream",
    "ChatStream",
    "ChunkAssembler",
    "SSEDecoder",
    "ServerSentEvent",
    "StreamDecoder",
]

OnComplete = Callable[[ChatCompletion], None]


@dataclass
class _ChoiceState:
    role: str = "assistant"
    content: list[str] | None = None
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None


class ChunkAssembler:
    """Folds chunks into the completion a non-streamed request would have returned."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = headers
        self._top: dict[str, Any] = {"object": "chat.completion"}
        self._choices: dict[int, _ChoiceState] = {}

    def add(self, chunk: Mapping[str, Any]) -> None:
        for key in ("id", "model", "created", "system_fingerprint", "usage", "sessiongate"):
            if chunk.get(key) is not None:
                self._top[key] = chunk[key]
        for choice in chunk.get("choices") or ():
            state = self._choices.setdefault(int(choice.get("index") or 0), _ChoiceState())
            delta = choice.get("delta") or {}
            if delta.get("role"):
                state.role = delta["role"]
            if delta.get("content") is not None:
                if state.content is None:
                    state.content = []
                state.content.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                self._merge_tool_call(state, call)
            if choice.get("finish_reason") is not None:
                state.finish_reason = choice["finish_reason"]

    @staticmethod
    def _merge_tool_call(state: _ChoiceState, call: Mapping[str, Any]) -> None:
        merged = state.tool_calls.setdefault(
            int(call.get("index") or 0),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id"):
            merged["id"] = call["id"]
        if call.get("type"):
            merged["type"] = call["type"]
        function = call.get("function") or {}
        if function.get("name"):
            merged["function"]["name"] += function["name"]
        if function.get("arguments"):
            merged["function"]["arguments"] += function["arguments"]

    def result(self) -> ChatCompletion:
        choices = []
        for index in sorted(self._choices):
            state = self._choices[index]
            content = "".join(state.content) if state.content is not None else None
            # As in a non-streamed reply, a reply made only of tool calls has content null, not "".
            message: dict[str, Any] = {
                "role": state.role,
                "content": (content or None) if state.tool_calls else content,
            }
            if state.tool_calls:
                message["tool_calls"] = [state.tool_calls[i] for i in sorted(state.tool_calls)]
            choices.append({"index": index, "message": message, "finish_reason": state.finish_reason})
        return parse_completion({**self._top, "choices": choices}, self._headers)


class StreamDecoder:
    """The I/O-free core of a chat stream: lines in, chunks out, the assembled completion at `[DONE]`."""

    def __init__(self, response: httpx.Response, on_complete: OnComplete | None = None) -> None:
        self._response = response
        self._sse = SSEDecoder()
        self._assembler = ChunkAssembler(response.headers)
        self._on_complete = on_complete
        self.completion: ChatCompletion | None = None

    @property
    def done(self) -> bool:
        return self.completion is not None

    def feed(self, line: str) -> ChatCompletionChunk | None:
        event = self._sse.decode(line)
        return self._handle(event) if event is not None else None

    def end(self) -> ChatCompletionChunk | None:
        """Called when the body ended: the last pending event, or an error if `[DONE]` never came."""
        event = self._sse.flush()
        chunk = self._handle(event) if event is not None else None
        if not self.done:
            raise APIConnectionError("The stream ended before [DONE].", request=self._response.request)
        return chunk

    def _handle(self, event: ServerSentEvent) -> ChatCompletionChunk | None:
        if self.done or not event.data:
            return None
        if event.done:
            self.completion = self._assembler.result()
            if self._on_complete is not None:
                self._on_complete(self.completion)
            return None
        try:
            payload = json.loads(event.data)
        except ValueError as exc:
            raise APIResponseValidationError(
                "A stream event is not JSON.", response=self._response, body=event.data
            ) from exc
        if not isinstance(payload, Mapping):
            raise APIResponseValidationError("A stream event is not an object.", response=self._response)
        if payload.get("error") is not None:
            body = error_body(payload)
            raise APIError(
                error_message(body, "The stream failed."),
                request=self._response.request,
                body=body,
                request_id=self._response.headers.get("x-request-id"),
            )
        try:
            self._assembler.add(payload)
            return parse_chunk(payload)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise APIResponseValidationError(
                f"A stream chunk does not match the wire format: {exc!r}",
                response=self._response,
                body=payload,
            ) from exc


class _StreamBase:
    response: httpx.Response
    _decoder: StreamDecoder

    @property
    def request_id(self) -> str | None:
        request_id: str | None = self.response.headers.get("x-request-id")
        return request_id

    @property
    def completion(self) -> ChatCompletion:
        """The assembled completion; available once the stream has been read to its end."""
        if self._decoder.completion is None:
            raise RuntimeError("The stream has not finished: iterate it to the end or call get_final_completion().")
        return self._decoder.completion


class ChatStream(_StreamBase):
    """A streamed chat completion: iterate it for `ChatCompletionChunk`s; then read `.completion`."""

    def __init__(self, response: httpx.Response, *, on_complete: OnComplete | None = None) -> None:
        self.response = response
        self._decoder = StreamDecoder(response, on_complete)
        self._iterator = self._iter_chunks()

    def _iter_chunks(self) -> Generator[ChatCompletionChunk, None, None]:
        try:
            for line in self.response.iter_lines():
                chunk = self._decoder.feed(line)
                if chunk is not None:
                    yield chunk
                if self._decoder.done:
                    return
            chunk = self._decoder.end()
            if chunk is not None:
                yield chunk
        except httpx.TransportError as exc:
            raise connection_error_from(exc, self.response.request) from exc
        finally:
            self.response.close()

    def __iter__(self) -> Iterator[ChatCompletionChunk]:
        return self

    def __next__(self) -> ChatCompletionChunk:
        return next(self._iterator)

    def get_final_completion(self) -> ChatCompletion:
        """Read the rest of the stream and return the assembled completion."""
        for _ in self:
            pass
        return self.completion

    def close(self) -> None:
        self._iterator.close()
        self.response.close()

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncChatStream(_StreamBase):
    """The async twin of `ChatStream`: `async for chunk in stream`, then `.completion`."""

    def __init__(self, response: httpx.Response, *, on_complete: OnComplete | None = None) -> None:
        self.response = response
        self._decoder = StreamDecoder(response, on_complete)
        self._iterator = self._iter_chunks()

    async def _iter_chunks(self) -> AsyncGenerator[ChatCompletionChunk, None]:
        try:
            async for line in self.response.aiter_lines():
                chunk = self._decoder.feed(line)
                if chunk is not None:
                    yield chunk
                if self._decoder.done:
                    return
            chunk = self._decoder.end()
            if chunk is not None:
                yield chunk
        except httpx.TransportError as exc:
            raise connection_error_from(exc, self.response.request) from exc
        finally:
            await self.response.aclose()

    def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        return await self._iterator.__anext__()

    async def get_final_completion(self) -> ChatCompletion:
        """Read the rest of the stream and return the assembled completion."""
        async for _ in self:
            pass
        return self.completion

    async def close(self) -> None:
        await self._iterator.aclose()
        await self.response.aclose()

    async def __aenter__(self) -> AsyncChatStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
