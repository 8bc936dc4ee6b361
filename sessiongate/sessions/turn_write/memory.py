"""What a store knows from its own writes (`StoreMemory`), so that the per-request path reads nothing back.

Completing a turn the store began and has not ended reads nothing back: its record is built from what began it
(`BegunTurn`). A turn of a session whose row the store's last write left claims its seq with one UPDATE that checks
the row is still as remembered (`ClaimedRow`). And a session's context is kept as its normalised messages
(`RememberedContext`), so that the history a request resends is compared with them instead of hashed message by
message. All of it is soft state, checked by the statements that rely on it (`persist`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessiongate.sessions import history

__all__ = ["MAX_CONTEXT_CHARS", "BegunTurn", "ClaimedRow", "RememberedContext", "StoreMemory"]


@dataclass(frozen=True, slots=True)
class RememberedContext:
    """A session's context as its normalised messages, with their digest and count (`messages` is `length` long)
    and about how many characters they hold (`history.message_chars`)."""

    digest: str
    length: int
    messages: list[history.NormalisedMessage]
    chars: int

    def extended(self, added: Sequence[history.NormalisedMessage]) -> RememberedContext:
        return RememberedContext(
            history.extend_normalised(self.digest, added),
            self.length + len(added),
            [*self.messages, *added],
            self.chars + sum(map(history.message_chars, added)),
        )


@dataclass(frozen=True, slots=True)
class BegunTurn:
    values: dict[str, Any]  # the turn's row as inserted (the keys of `_convert.pending_turn_record`)
    base: tuple[str, int] | None  # the session's context (digest, length) the turn extends; None: it restarts it
    context: RememberedContext  # the context with the turn's input messages


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    """A session's row as this store's last write left it: the values the claim of its next seq checks (the next
    seq is `turn_count + 1`)."""

    turn_count: int
    digest: str
    length: int
    priority: int


# How many characters of contexts `StoreMemory` keeps at most (the normalised messages share the strings of the requests
# they came from; a character is a byte or more): the sessions served least recently give theirs up first.
MAX_CONTEXT_CHARS = 64_000_000


class StoreMemory:
    """What this store knows from its own writes, newest last: the turns it began and has not ended, the sessions'
    rows as its last turns left them, and their contexts' normalised messages. Soft state: what is evicted, or made
    wrong by another writer, costs only the general path (each use is checked by the statement that relies on it;
    a context is used only for the digest and length that the session's row has)."""

    def __init__(self, max_entries: int = 10_000, max_context_chars: int = MAX_CONTEXT_CHARS) -> None:
        self._turns: OrderedDict[str, BegunTurn] = OrderedDict()
        self._sessions: OrderedDict[str, ClaimedRow] = OrderedDict()
        self._contexts: OrderedDict[str, RememberedContext] = OrderedDict()
        self._context_chars = 0
        self._max_entries = max_entries
        self._max_context_chars = max_context_chars

    def add(self, turn_id: str, begun: BegunTurn) -> None:
        self._turns[turn_id] = begun
        while len(self._turns) > self._max_entries:
            self._turns.popitem(last=False)

    def pop(self, turn_id: str) -> BegunTurn | None:
        return self._turns.pop(turn_id, None)

    def turns_in_flight(self) -> int:
        """The turns begun here and not ended (at most `max_entries`)."""
        return len(self._turns)

    def session(self, session_id: str) -> ClaimedRow | None:
        return self._sessions.get(session_id)

    def remember_session(self, session_id: str, claimed: ClaimedRow) -> None:
        self._sessions.pop(session_id, None)
        self._sessions[session_id] = claimed
        while len(self._sessions) > self._max_entries:
            self._sessions.popitem(last=False)

    @property
    def context_chars(self) -> int:
        """The characters of the contexts kept now."""
        return self._context_chars

    def context(self, session_id: str, digest: str, length: int) -> RememberedContext | None:
        """The session's context if it is the one of this digest and length."""
        known = self._contexts.get(session_id)
        if known is None or known.digest != digest or known.length != length:
            return None
        return known

    def move_context(self, session_id: str, context: RememberedContext) -> None:
        known = self._sessions.get(session_id)
        if known is not None:
            self._sessions[session_id] = ClaimedRow(known.turn_count, context.digest, context.length, known.priority)
        self._forget_context(session_id)
        if context.chars > self._max_context_chars:
            return
        self._contexts[session_id] = context
        self._context_chars += context.chars
        while self._context_chars > self._max_context_chars or len(self._contexts) > self._max_entries:
            _, oldest = self._contexts.popitem(last=False)
            self._context_chars -= oldest.chars

    def forget_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._forget_context(session_id)

    def _forget_context(self, session_id: str) -> None:
        known = self._contexts.pop(session_id, None)
        if known is not None:
            self._context_chars -= known.chars
