"""The sessions aggregate of `SessionStore`: session rows (the tenant's and the admin's calls), forks, prefix breaks
and the Responses API's responses, each a turn of its session. `SqlSessionStore` implements them in
`sessions.store.sessions`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from sessiongate.sessions.records import Page, ResponseRecord, SessionRecord

__all__ = ["ForksStore", "PrefixBreaksStore", "ResponsesStore", "SessionsStore"]


class SessionsStore(Protocol):
    """Sessions: created, read, listed, updated, deleted; their context; the admin's lookups across tenants."""

    async def create_session(
        self,
        *,
        tenant_id: str = "default",
        session_id: str | None = None,
        priority: int = 0,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionRecord:
        """A new active session (`sess_` + 24 hex when no id is given); `SessionExists` if the id is taken."""
        ...

    async def get_session(self, session_id: str, *, tenant_id: str) -> SessionRecord: ...

    async def get_or_create_session(self, session_id: str, *, tenant_id: str) -> tuple[SessionRecord, bool]:
        """The session and whether this call created it; concurrent calls agree on one row.

        `SessionExists` if the id belongs to another tenant."""
        ...

    async def list_sessions(
        self, *, tenant_id: str, limit: int = 20, after: str | None = None, state: str | None = None
    ) -> Page[SessionRecord]:
        """Newest first (created_at desc, then id); `after` is the last id of the previous page."""
        ...

    async def update_session(
        self,
        session_id: str,
        *,
        tenant_id: str,
        priority: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        state: str | None = None,
    ) -> SessionRecord:
        """Change the fields given (None leaves one as it is); `metadata` replaces the whole dict."""
        ...

    async def delete_session(self, session_id: str, *, tenant_id: str) -> None:
        """Delete the session with its turns, tool calls and advisories."""
        ...

    async def session_context(
        self, session_id: str, *, tenant_id: str, before_seq: int | None = None
    ) -> list[dict[str, Any]]:
        """The conversation so far, as the model saw it (see `sessions.history`); with `before_seq`, as it was
        before that turn (what the turn's resent history was compared with)."""
        ...

    async def find_extended_sessions(
        self, *, tenant_id: str, contexts: Sequence[tuple[str, int]], limit: int = 2
    ) -> list[tuple[str, int]]:
        """The tenant's active sessions whose context is one of `contexts` ((digest, length in messages)), as
        (session id, context length), longest context first, at most `limit` of the longest length."""
        ...

    async def find_session(self, session_id: str) -> SessionRecord:
        """The session whatever its tenant (the admin API's lookup); `SessionNotFound` if there is none."""
        ...

    async def search_sessions(
        self,
        *,
        tenant_id: str | None = None,
        state: str | None = None,
        active_after: datetime | None = None,
        active_before: datetime | None = None,
        min_priority: int | None = None,
        max_priority: int | None = None,
        limit: int = 50,
        after: str | None = None,
        min_prefix_breaks: int | None = None,
    ) -> Page[SessionRecord]:
        """Sessions of any or one tenant matching every filter given, most recently active first (then id);
        `after` is the last id of the previous page."""
        ...


class ForksStore(Protocol):
    """A session's fork: a new session sharing its parent's context (`sessions.forks`)."""

    async def fork_session(
        self,
        parent_id: str,
        *,
        tenant_id: str,
        child_id: str | None = None,
        at_seq: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[SessionRecord, int]:
        """A new session of the tenant sharing the parent's context up to its turn `at_seq` (all of it by default):
        the child and the number of context messages shared. `TurnNotFound` for a seq that is not an ok turn."""
        ...


class PrefixBreaksStore(Protocol):
    """Where a turn's resent history broke its session's context (`sessions.prefix_breaks`)."""

    async def record_prefix_break(self, turn_id: str, *, session_id: str, detail: Mapping[str, Any]) -> None:
        """Note on the turn where its resent history broke the session's context prefix, and count it."""
        ...


class ResponsesStore(Protocol):
    """Responses API responses, each a turn of the session its chain is (`sessions.responses`)."""

    async def create_response(
        self,
        response_id: str,
        *,
        tenant_id: str,
        session_id: str,
        turn_id: str,
        previous_response_id: str | None,
        instructions: str | None,
        input_items: Sequence[Mapping[str, Any]],
        body: Mapping[str, Any],
    ) -> ResponseRecord:
        """Store a response as the turn `turn_id` of the session `session_id`."""
        ...

    async def get_response(self, response_id: str, *, tenant_id: str) -> ResponseRecord:
        """The tenant's response; `ResponseNotFound` for another tenant's, as for one that does not exist."""
        ...

    async def response_context(
        self, response_id: str, *, tenant_id: str
    ) -> tuple[ResponseRecord, list[dict[str, Any]]]:
        """The response and its session's context as it stood after its turn (what the next response continues)."""
        ...

    async def delete_response(self, response_id: str, *, tenant_id: str) -> tuple[ResponseRecord, bool]:
        """Delete the response; the record, and whether it was its session's latest response."""
        ...
