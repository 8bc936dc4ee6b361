"""The interface every shared-state backend implements, and the records it moves.

Who calls each operation, and when:

    begin_turn(session_id, now)            chat path, once per turn before routing (distributed backends only):
                                           claims the session's pending advisory (atomic: one turn, on one
                                           replica, gets it) and reads its KV belief, in one round trip
    put_advisory(record)                   advisor, when a signal creates an advisory (the owner replica)
    update_advisory(session_id, id, ...)   owner: fired / ready / failed; another replica: refresh or stop
    get_advisory(session_id)               advisor, on a signal that finds no live advisory in its own book
    request_fire(session_id, ...)          another replica, on a tool result for a scheduled advisory it does not
                                           own: marks the record (`fire_requested_at`, once) and queues the
                                           request for its owner (atomic: the owner alone fires it)
    fire_requests(owner)                   owner, at each tick while it holds a scheduled shared advisory: takes
                                           the requests queued for it (one round trip for all its advisories)
    end_advisory(session_id, id, now)      owner, when its copy expires: "ended" (the owner settles it: it is
                                           removed, or was lost), "extended" (refreshed on another replica: the
                                           record says until when) or "gone" (a turn claimed it, on any replica;
                                           that replica settles it)
    put_kv / drop_kv                       after each turn and finished prefetch / admin KV drop
    take_tokens(tenant, capacity, amount)  admission (amount 0: read the level) and each turn's charge
    set_if_absent(key, ttl_s)              the webhook replay cache
    add_sample / samples                   hint quality: each settled outcome, read on each signal
    incr / counters                        advisory statistics (GET /v1/admin/advisories/stats)

Times in records are Unix seconds from the replica's clock (replicas keep their clocks in sync with NTP; the
expiries are tens of seconds, clock skew milliseconds). A backend that cannot reach its store raises
`SharedUnavailable`; every caller then decides with its own replica's state for that request, never fails it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["SharedAdvisory", "SharedKV", "SharedState", "SharedTurn", "SharedUnavailable"]


class SharedUnavailable(Exception):
    """The shared store did not answer: decide locally for this request."""


@dataclass(frozen=True, slots=True)
class SharedAdvisory:
    """A live advisory as every replica sees it. `owner` is the replica that runs its prefetch."""

    id: str
    session_id: str
    tenant_id: str
    kind: str
    worker_id: str
    worker_url: str
    target: str
    owner: str
    expires_at: float
    fired: bool = False
    ready_at: float | None = None
    failed: bool = False
    stopped: bool = False
    bytes_loaded: int | None = None
    # A tool result on another replica asked the owner to fire it now (Unix time); the owner then fired it early.
    fire_requested_at: float | None = None
    fired_early: bool = False


@dataclass(frozen=True, slots=True)
class SharedKV:
    """One session's KV belief (`gateway.routing.KVBelief`'s entry), with Unix times."""

    workers: Mapping[str, tuple[int, str, float]] = field(default_factory=dict)
    pool: int = 0
    last_worker: str | None = None
    context_tokens: int = 0
    last_report: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SharedTurn:
    """What a turn reads before routing: the advisory it claimed (if any) and the session's KV belief."""

    advisory: SharedAdvisory | None
    kv: SharedKV | None


EndState = Literal["ended", "extended", "gone"]


class SharedState(Protocol):
    # False for the in-process backend: one process's own memory already is the whole state, so the chat path
    # skips the shared calls entirely (no await, no copy) and the single-process gateway costs what it did.
    distributed: bool

    # False from a failed call until one succeeds again: meanwhile the replica decides with its own state (`/readyz`
    # and `/metrics` say so). `failures` counts the calls that failed since the start. Always True / 0 in-process.
    @property
    def available(self) -> bool: ...

    @property
    def failures(self) -> int: ...

    async def ping(self) -> bool:
        """Whether the store answers now (raises `SharedUnavailable` when it does not)."""
        ...

    async def begin_turn(self, session_id: str, now: float) -> SharedTurn: ...

    async def put_advisory(self, record: SharedAdvisory, *, keep_s: float) -> None:
        """Store `record` (replacing any other of its session) for `keep_s` past its expiry."""
        ...

    async def update_advisory(self, session_id: str, advisory_id: str, keep_s: float, **changes: Any) -> bool:
        """Change fields of the session's advisory if it is still `advisory_id`; False when it is not."""
        ...

    async def get_advisory(self, session_id: str) -> SharedAdvisory | None: ...

    async def request_fire(
        self, session_id: str, *, expires_at: float, now: float, keep_s: float
    ) -> SharedAdvisory | None:
        """Ask the owner of the session's advisory to fire it now: if it is unexpired at `now`, not fired and not
        yet asked, mark `fire_requested_at`, extend its expiry to at least `expires_at`, queue (session, id) for
        its owner and return the record as changed; else None (nothing changed)."""
        ...

    async def fire_requests(self, owner: str) -> list[tuple[str, str]]:
        """The (session, advisory id) fire requests queued for `owner` since its last call, oldest first; taken."""
        ...

    async def end_advisory(
        self, session_id: str, advisory_id: str, now: float
    ) -> tuple[EndState, SharedAdvisory | None]: ...

    async def put_kv(self, session_id: str, kv: SharedKV, *, ttl_s: float) -> None: ...

    async def drop_kv(self, session_id: str) -> None: ...

    async def take_tokens(self, tenant_id: str, *, capacity: float, amount: float, now: float) -> float:
        """Refill the tenant's bucket (`capacity` per minute) to `now`, take `amount`: the level after."""
        ...

    async def set_if_absent(self, key: str, *, ttl_s: float) -> bool:
        """True if `key` was not set (and now is, for `ttl_s`); False if it already was."""
        ...

    async def add_sample(self, keys: Sequence[str], sample: tuple[float, bool], *, max_len: int, ttl_s: float) -> None:
        """Append `sample` to each key's list, keeping its last `max_len`."""
        ...

    async def samples(self, keys: Sequence[str]) -> list[list[tuple[float, bool]]]:
        """Each key's samples, oldest first."""
        ...

    async def incr(self, key: str, counts: Mapping[str, float]) -> None: ...

    async def counters(self, key: str) -> dict[str, float]: ...

    async def aclose(self) -> None: ...
