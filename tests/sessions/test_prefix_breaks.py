"""`find_break`: the first message where a resent history differs from the stored context, and its kind."""

from __future__ import annotations

from typing import Any

import pytest

from sessiongate.sessions.prefix_breaks import find_break

SYSTEM = {"role": "system", "content": "You are a careful agent. " * 10}
USER = {"role": "user", "content": "list the files"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
CONTEXT: list[dict[str, Any]] = [
    SYSTEM,
    USER,
    {"role": "assistant", "content": "<think>the user wants ls</think>Calling ls.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "a.py b.py"},
    {"role": "assistant", "content": "There are two files."},
]
NEXT = {"role": "user", "content": "and now?"}


def test_an_extension_is_no_break() -> None:
    assert find_break(CONTEXT, [*CONTEXT, NEXT]) is None


@pytest.mark.parametrize(
    ("change", "index", "kind"),
    [
        (lambda m: [{**SYSTEM, "content": "New rules."}, *m[1:]], 0, "system_changed"),
        (lambda m: [*m[:2], {**m[2], "content": "Calling ls."}, *m[3:]], 2, "reasoning_stripped"),
        (lambda m: [*m[:4], {**m[4], "content": "Two files, a and b."}], 4, "assistant_edited"),
        (lambda m: [*m[:3], {**m[3], "content": "(elided)"}, m[4]], 3, "tool_history_rewritten"),
        (lambda m: [SYSTEM, {"role": "user", "content": "Summary: the user listed two files."}], 1, "compaction"),
        (lambda m: m[:3], 3, "rewound"),
    ],
)
def test_kinds(change: Any, index: int, kind: str) -> None:
    found = find_break(CONTEXT, [*change(CONTEXT), NEXT] if kind != "rewound" else change(CONTEXT))
    assert found is not None
    assert (found.index, found.kind) == (index, kind)
    assert found.tokens_lost > 0
    assert found.tokens_kept == (0 if index == 0 else found.tokens_kept)
