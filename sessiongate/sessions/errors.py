"""The store's exception tree, and the one place where database failures are translated into it.

```
StoreError
├── SessionNotFound       no such session, or it belongs to another tenant
├── TurnNotFound
├── ResponseNotFound      no such stored response, or it belongs to another tenant
├── ToolCallNotFound      no tool call with that call_id in the session
├── AdvisoryNotFound
├── ApiKeyNotFound
├── SessionExists         the session id is already taken (by this tenant or another)
├── InvalidTransition     e.g. completing a turn that is no longer pending, a turn in a closed session
└── StoreUnavailable      the database cannot be reached or timed out (connection refused, pool timeout,
                          connection lost, SQLite file cannot be opened or stays locked)
```

Invalid arguments (a naive datetime, an unknown state, a session id over 128 characters) are programming
errors of the caller and raise `ValueError`, not a `StoreError`.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import exc as sa_exc

__all__ = [
    "AdvisoryNotFound",
    "ApiKeyNotFound",
    "InvalidTransition",
    "ResponseNotFound",
    "SessionExists",
    "SessionNotFound",
    "StoreError",
    "StoreUnavailable",
    "ToolCallNotFound",
    "TurnNotFound",
    "is_unavailable",
]


class StoreError(Exception):
    """Base class of every error the session store raises on purpose."""


class SessionNotFound(StoreError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found")
        self.session_id = session_id


class TurnNotFound(StoreError):
    def __init__(self, turn_id: str) -> None:
        super().__init__(f"turn {turn_id!r} not found")
        self.turn_id = turn_id


class ResponseNotFound(StoreError):
    def __init__(self, response_id: str) -> None:
        super().__init__(f"response {response_id!r} not found")
        self.response_id = response_id


class ToolCallNotFound(StoreError):
    def __init__(self, session_id: str, call_id: str) -> None:
        super().__init__(f"tool call {call_id!r} not found in session {session_id!r}")
        self.session_id = session_id
        self.call_id = call_id


class AdvisoryNotFound(StoreError):
    def __init__(self, advisory_id: str) -> None:
        super().__init__(f"advisory {advisory_id!r} not found")
        self.advisory_id = advisory_id


class ApiKeyNotFound(StoreError):
    def __init__(self, key_id: str) -> None:
        super().__init__(f"API key {key_id!r} not found")
        self.key_id = key_id


class SessionExists(StoreError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists")
        self.session_id = session_id


class InvalidTransition(StoreError):
    """The object exists but is not in a state that allows the operation."""


class StoreUnavailable(StoreError):
    """The database could not be reached or did not answer in time; the operation may be retried."""


# SQLSTATE classes that mean "the server or the connection is gone", not "your statement is wrong":
# 08 connection exception, 53 insufficient resources (too many connections), 57P operator intervention
# (admin shutdown, crash shutdown, cannot connect now), 3D000 the database does not exist (yet).
_UNAVAILABLE_SQLSTATE_PREFIXES = ("08", "53", "57P", "3D000")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        for nxt in (orig, current.__cause__, current.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` (or anything it wraps) says the database is unreachable rather than the request wrong."""
    for current in _chain(exc):
        if isinstance(current, StoreError):
            return False
        if isinstance(
            current,
            sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError | TimeoutError | OSError,
        ):
            return True
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        sqlstate = getattr(current, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate.startswith(_UNAVAILABLE_SQLSTATE_PREFIXES):
            return True
        # asyncpg's client-side connection errors (no sqlstate), matched by name so asyncpg stays optional.
        names = {cls.__name__ for cls in type(current).__mro__ if cls.__module__.startswith("asyncpg")}
        if names & {"InterfaceError", "PostgresConnectionError", "ConnectionDoesNotExistError"}:
            return True
    return False
