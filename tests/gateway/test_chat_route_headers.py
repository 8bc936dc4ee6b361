"""The chat route's request answers as Starlette's does: its indexed headers every lookup, its body every read."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request

from sessiongate.gateway.turn.route import _ChatRequest, _IndexedHeaders

_RAW = [
    (b"host", b"gw"),
    (b"x-session-id", b"first"),
    (b"content-type", b"application/json"),
    (b"x-session-id", b"second"),  # repeated: the first wins
    (b"x-caf\xe9", b"latin-1 \xe9"),
    (b"authorization", b"Bearer k"),
    (b"empty", b""),
]
_KEYS = ["host", "X-Session-Id", "x-session-id", "Content-Type", "x-café", "authorization", "empty", "missing", ""]


@pytest.mark.parametrize("key", _KEYS)
def test_lookups_match_starlettes(key: str) -> None:
    scope = {"type": "http", "headers": _RAW}
    ours, theirs = _IndexedHeaders(scope=scope), Headers(scope=scope)
    assert ours.get(key) == theirs.get(key)
    assert ours.get(key, "default") == theirs.get(key, "default")
    assert (key in ours) == (key in theirs)
    if key in theirs:
        assert ours[key] == theirs[key]
    else:
        with pytest.raises(KeyError):
            ours[key]


def test_iteration_and_lists_are_starlettes() -> None:
    scope = {"type": "http", "headers": _RAW}
    ours, theirs = _IndexedHeaders(scope=scope), Headers(scope=scope)
    assert ours.getlist("x-session-id") == theirs.getlist("x-session-id") == ["first", "second"]
    assert list(ours.items()) == list(theirs.items())


_BODIES = {
    "one message": [{"type": "http.request", "body": b'{"a": 1}', "more_body": False}],
    "chunked": [
        {"type": "http.request", "body": b'{"a"', "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b": 1}"},
    ],
    "empty": [{"type": "http.request"}],
    "client gone": [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}],
}


@pytest.mark.anyio
@pytest.mark.parametrize("messages", _BODIES.values(), ids=_BODIES.keys())
async def test_the_body_reads_as_starlettes(messages: list[dict[str, Any]]) -> None:
    async def outcome(request_type: type[Request]) -> list[Any]:
        pending = list(messages)

        async def receive() -> dict[str, Any]:
            return pending.pop(0)

        request = request_type({"type": "http", "headers": []}, receive)
        reads: list[Any] = []
        for _ in range(2):  # a second read gives what the first did, or the same error
            try:
                reads.append(await request.body())
            except Exception as exc:  # ClientDisconnect, a consumed stream, or what `receive` raised
                reads.append(type(exc))
        return [*reads, len(pending)]

    ours = await outcome(_ChatRequest)
    assert ours == await outcome(Request)
    if messages[-1]["type"] == "http.disconnect":
        assert ours[0] is ClientDisconnect
    else:
        assert ours[:2] == [b"".join(m.get("body", b"") for m in messages)] * 2
