"""A streamed chat turn's SSE, translated to the Responses API's event sequence as it is relayed.

The chat relay (`gateway/turn/relay.py`) records the turn as it always does; this wraps its ASGI `send`. Each chat chunk
becomes the Responses events it stands for: `response.created` and `response.in_progress` first, then per output
item `response.output_item.added`, for text `response.content_part.added`, `response.output_text.delta`...,
`response.output_text.done`, `response.content_part.done`, for a function call
`response.function_call_arguments.delta`... and `.done`, then `response.output_item.done`. The relay's last
message comes after it recorded the turn: only then is the response stored and `response.completed` sent, so a
client that reads to the end may at once continue the chain with `previous_response_id`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from .convert import function_call_item, message_item, new_id, response_object

__all__ = ["EventStream", "Finished"]

# Called once the relay has recorded the turn: (the final response object, the chat turn's headers) -> None.
Finished = Callable[[dict[str, Any], dict[str, str]], Awaitable[None]]


@dataclass
class _Call:
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str = ""


@dataclass
class _State:
    output: list[dict[str, Any]] = field(default_factory=list)
    text_id: str | None = None
    text_index: int = 0
    text: str = ""
    calls: dict[int, _Call] = field(default_factory=dict)
    open_call: int | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: dict[str, Any] | None = None
    done: bool = False


class EventStream(Response):
    """The Responses event stream around a chat `StreamRelay`'s response (`inner`)."""

    media_type = "text/event-stream"

    def __init__(
        self, inner: Response, response_id: str, request: Mapping[str, Any], created_at: int, finished: Finished
    ) -> None:
        self.status_code = inner.status_code
        self.background = None
        self.raw_headers = list(inner.raw_headers)
        self.inner = inner
        self.response_id = response_id
        self.request = request
        self.created_at = created_at
        self.finished = finished
        self.sequence = 0
        self.state = _State()
        self.buffer = b""
        self.turn_headers: dict[str, str] = {}

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _snapshot(self, status: str) -> dict[str, Any]:
        state = self.state
        return response_object(
            self.response_id,
            self.request,
            status=status,
            output=list(state.output),
            model=state.model,
            usage=state.usage,
            finish_reason=state.finish_reason,
            created_at=self.created_at,
            error=state.error,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def translate(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.turn_headers = {k.decode(): v.decode() for k, v in message.get("headers", ())}
                await send(message)
                opening = self._event("response.created", response=self._snapshot("in_progress"))
                opening += self._event("response.in_progress", response=self._snapshot("in_progress"))
                await send({"type": "http.response.body", "body": opening, "more_body": True})
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            self.buffer += message.get("body", b"")
            out = []
            while b"\n\n" in self.buffer:
                event, self.buffer = self.buffer.split(b"\n\n", 1)
                out.append(self._chat_event(event))
            if message.get("more_body", False):
                body = b"".join(out)
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                return
            out.append(self._close_items())
            status = "failed" if self.state.error is not None or not self.state.done else "completed"
            final = self._snapshot(status)
            if status == "completed":
                await self.finished(final, self.turn_headers)
            kind = "response.completed" if final["status"] in ("completed", "incomplete") else "response.failed"
            if final["status"] == "incomplete":
                kind = "response.incomplete"
            out.append(self._event(kind, response=final))
            await send({"type": "http.response.body", "body": b"".join(out), "more_body": False})

        await self.inner(scope, receive, translate)

    def _chat_event(self, event: bytes) -> bytes:
        data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if not data:
            return b""
        if data == b"[DONE]":
            self.state.done = True
            return b""
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            self.state.error = {"code": str(error.get("code") or "server_error"), "message": str(error.get("message"))}
            return self._event("error", code=self.state.error["code"], message=self.state.error["message"], param=None)
        self.state.model = chunk.get("model") or self.state.model
        if isinstance(chunk.get("usage"), dict):
            self.state.usage = chunk["usage"]
        out = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                out.append(self._text_delta(delta["content"]))
            for call in delta.get("tool_calls") or ():
                out.append(self._call_delta(call))
            if choice.get("finish_reason"):
                self.state.finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _text_delta(self, text: str) -> bytes:
        state, out = self.state, b""
        if state.text_id is None:
            out += self._close_call()
            state.text_id, state.text_index = new_id("msg_"), len(state.output)
            item = message_item(state.text_id, "", status="in_progress")
            item["content"] = []
            state.output.append(item)
            out += self._event("response.output_item.added", output_index=state.text_index, item=item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event(
                "response.content_part.added",
                item_id=state.text_id,
                output_index=state.text_index,
                content_index=0,
                part=part,
            )
        state.text += text
        return out + self._event(
            "response.output_text.delta",
            item_id=state.text_id,
            output_index=state.text_index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _close_text(self) -> bytes:
        state = self.state
        if state.text_id is None:
            return b""
        item_id, index, text = state.text_id, state.text_index, state.text
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item = message_item(item_id, text)
        state.output[index] = item
        state.text_id = None
        return (
            self._event(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
            + self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0, part=part)
            + self._event("response.output_item.done", output_index=index, item=item)
        )

    def _call_delta(self, call: Mapping[str, Any]) -> bytes:
        state, out = self.state, b""
        index = int(call.get("index") or 0)
        function = call.get("function") or {}
        current = state.calls.get(index)
        if current is None:
            out += self._close_text() + self._close_call()
            current = _Call(
                new_id("fc_"), len(state.output), str(call.get("id") or ""), str(function.get("name") or "")
            )
            state.calls[index] = current
            state.open_call = index
            item = function_call_item(current.item_id, current.call_id, current.name, "", status="in_progress")
            state.output.append(item)
            out += self._event("response.output_item.added", output_index=current.output_index, item=item)
        elif function.get("name"):
            current.name += str(function["name"])
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            current.arguments += arguments
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=current.item_id,
                output_index=current.output_index,
                delta=arguments,
            )
        return out

    def _close_call(self) -> bytes:
        state = self.state
        if state.open_call is None:
            return b""
        call = state.calls[state.open_call]
        state.open_call = None
        item = function_call_item(call.item_id, call.call_id, call.name, call.arguments)
        state.output[call.output_index] = item
        return self._event(
            "response.function_call_arguments.done",
            item_id=call.item_id,
            output_index=call.output_index,
            name=call.name,
            arguments=call.arguments,
        ) + self._event("response.output_item.done", output_index=call.output_index, item=item)

    def _close_items(self) -> bytes:
        return self._close_text() + self._close_call()
