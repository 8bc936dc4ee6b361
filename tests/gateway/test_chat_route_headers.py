"""The chat route's indexed headers answer every lookup as Starlette's `Headers` does."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from sessiongate.gateway.chat_route import _IndexedHeaders

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
