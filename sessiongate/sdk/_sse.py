"""Server-sent events (SSE): the one decoder of chat streams in this project.

The SDK's chat streams use it, and so do the benchmarks and the tests (they import `sdk._sse`; the SDK imports
nothing from them). Lines in, events out, as the SSE specification has it: `data:` lines of one event are
joined by newlines, a blank line dispatches the event, a line starting with `:` is a comment, one space after
the colon is dropped. An OpenAI-style stream ends with the event whose data is `[DONE]` (`ServerSentEvent.done`).

    for event in iter_events(response.iter_lines()):         # httpx, sync
    async for event in aiter_events(response.aiter_lines()):  # httpx, async
    for event in parse_events(response.content):             # a whole body, read already
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["DONE", "SSEDecoder", "ServerSentEvent", "aiter_events", "iter_events", "parse_events"]

DONE = "[DONE]"
# SSE ends a line at CRLF, LF or CR, and nowhere else (str.splitlines would also split at U+2028, which JSON
# may carry unescaped).
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class ServerSentEvent:
    event: str | None
    data: str

    @property
    def done(self) -> bool:
        """The `[DONE]` event that ends an OpenAI-style stream."""
        return self.data.strip() == DONE

    def json(self) -> Any:
        """The event's data, parsed as JSON (raises `ValueError` if it is not)."""
        return json.loads(self.data)


class SSEDecoder:
    """Line-by-line server-sent-events decoder (`data:` lines joined by newlines, a blank line dispatches)."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []

    def decode(self, line: str) -> ServerSentEvent | None:
        """Feed one line (without its line ending); returns an event when the line completes one."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> ServerSentEvent | None:
        """The pending event, if any (called at a blank line and at the end of the stream)."""
        if not self._data and self._event is None:
            return None
        event = ServerSentEvent(event=self._event, data="\n".join(self._data))
        self._event, self._data = None, []
        return event


def iter_events(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    """The events of a stream of lines; an event left pending when the lines end is dispatched too."""
    decoder = SSEDecoder()
    for line in lines:
        event = decoder.decode(line)
        if event is not None:
            yield event
    last = decoder.flush()
    if last is not None:
        yield last


async def aiter_events(lines: AsyncIterable[str]) -> AsyncIterator[ServerSentEvent]:
    """`iter_events` for an async stream of lines."""
    decoder = SSEDecoder()
    async for line in lines:
        event = decoder.decode(line)
        if event is not None:
            yield event
    last = decoder.flush()
    if last is not None:
        yield last


def parse_events(body: str | bytes) -> list[ServerSentEvent]:
    """The events of a whole stream body."""
    text = body.decode() if isinstance(body, bytes) else body
    return list(iter_events(_LINE_END.split(text)))
