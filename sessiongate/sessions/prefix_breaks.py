"""Where a resent history stops matching the session's stored context, and what kind of change it was.

A client resends the whole conversation each turn; when its messages do not start with the stored context
(`history.starts_with_context` said no), the turn is a *prefix break*: the worker's cached KV for the session is
good only up to the first differing message, and everything after it is prefilled again. `find_break` compares the
two lists (only on such a turn: the store keeps digests, and the gateway reads the context back just then) and
names the first difference: its message index, the prompt kept before it and lost from it (in tokens, estimated at
four characters a token: the gateway has no tokenizer) and its kind.

Kinds: `system_changed` (the system prompt at the start), `reasoning_stripped` (an assistant message that lost its
`<think>` block or reasoning field), `assistant_edited` (an assistant message's text), `tool_history_rewritten` (a
tool call or tool result), `compaction` (the history was replaced by a shorter one from that point: a summary),
`rewound` (the request ends inside the stored context: an undo or a retry of an earlier turn), `other`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .history import content_text, message_chars, normalise_message

__all__ = ["PrefixBreak", "find_break"]

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class PrefixBreak:
    index: int  # the first message that differs from the stored context
    kind: str
    tokens_kept: int  # estimated prompt tokens before the break (still cached)
    tokens_lost: int  # estimated tokens of the stored context from the break on (prefilled again)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(message_chars(normalise_message(m)) for m in messages) // _CHARS_PER_TOKEN


def _kind(stored: Mapping[str, Any], sent: Mapping[str, Any] | None, index: int, compacted: bool) -> str:
    if sent is None:
        return "rewound"
    role = stored.get("role")
    if role == "system" and index == 0:
        return "system_changed"
    if role == "assistant" and sent.get("role") == "assistant":
        if normalise_message(stored)[2] != normalise_message(sent)[2]:
            return "tool_history_rewritten"
        old, new = content_text(stored.get("content")), content_text(sent.get("content"))
        stripped = (stored.get("reasoning_content") and not sent.get("reasoning_content")) or (
            _THINK.search(old) is not None and _THINK.sub("", old).strip() == new.strip()
        )
        return "reasoning_stripped" if stripped else "assistant_edited"
    if "tool" in (role, sent.get("role")):
        return "tool_history_rewritten"
    return "compaction" if compacted else "other"


def find_break(context: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]) -> PrefixBreak | None:
    """The first difference between the stored `context` and a request's `messages`; None if they extend it."""
    for index, stored in enumerate(context):
        sent = messages[index] if index < len(messages) else None
        if sent is not None and normalise_message(stored) == normalise_message(sent):
            continue
        # A history that goes on shorter than what it replaces, from a non-assistant message, was compacted.
        compacted = sent is not None and len(messages) - index < len(context) - index
        return PrefixBreak(
            index=index,
            kind=_kind(stored, sent, index, compacted),
            tokens_kept=_tokens(context[:index]),
            tokens_lost=_tokens(context[index:]),
        )
    return None
