"""The one SSE decoder (`sdk._sse`), as the SDK, the benchmarks and the tests use it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sessiongate.sdk._sse import ServerSentEvent, aiter_events, iter_events, parse_events

pytestmark = pytest.mark.anyio


def test_events_as_the_specification_splits_them() -> None:
    body = (
        ": a comment\r\n"
        "event: note\r\n"
        "data: first line\r\n"
        "data:second line\r\n"
        "\r\n"
        'data: {"text": "a\u2028b"}\n'  # a line separator inside JSON is no line end
        "\n"
        "data: [DONE]\r"
        "\r"
    )
    events = parse_events(body.encode())
    assert events == [
        ServerSentEvent(event="note", data="first line\nsecond line"),
        ServerSentEvent(event=None, data='{"text": "a\u2028b"}'),
        ServerSentEvent(event=None, data="[DONE]"),
    ]
    assert events[1].json() == {"text": "a\u2028b"}
    assert [e.done for e in events] == [False, False, True]


def test_an_event_left_pending_at_the_end_is_dispatched() -> None:
    assert [e.data for e in iter_events(["data: 1", "", "data: 2"])] == ["1", "2"]
    assert list(iter_events([": only a comment", ""])) == []


async def test_async_lines() -> None:
    async def lines() -> AsyncIterator[str]:
        for line in ("data: a", "", "data: [DONE]", ""):
            yield line

    assert [e.data async for e in aiter_events(lines())] == ["a", "[DONE]"]
