"""What a routing policy sees: immutable views of the workers, the request, and where the session's KV is.

These values are built by the gateway (or by the simulator) from its soft state just before each choice, so a
policy is a pure function of them plus its own small memory (a rotation counter, a prefix index). Times are
seconds on one monotonic clock chosen by the caller; policies never read a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["KVResidency", "Reservation", "RouteRequest", "WorkerView"]


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy may know about one routable worker.

    `in_flight` is the gateway's own count of requests it has sent there and not yet seen end. `running` and
    `queued` come from the worker's load report (None when the worker has no extension or its report is
    stale); they include other replicas' requests, which the gateway cannot count itself.
    """

    id: str
    url: str
    in_flight: int
    running: int | None = None
    queued: int | None = None
    # In-flight requests sent since the report was made (not yet in `running`/`queued`).
    in_flight_since_report: int = 0
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    # Token figures for `dynamo_cost` (None where nobody counts them): prompt tokens queued or being prefilled and
    # not yet computed, and the KV tokens of the sequences the worker is decoding.
    active_prefill_tokens: int | None = None
    active_kv_tokens: int | None = None
    # The device KV pool's size in tokens (the worker's report): with `active_kv_tokens`, whether a request fits.
    device_kv_tokens: int | None = None

    @property
    def load(self) -> int:
        """Requests ahead of a new one: the report plus what was sent since, else the gateway's own count."""
        if self.running is None or self.queued is None:
            return self.in_flight
        return self.running + self.queued + self.in_flight_since_report


@dataclass(frozen=True, slots=True)
class KVResidency:
    """The gateway's belief of where one session's KV is, as prefix lengths in tokens.

    `device` / `host`: per worker id, how many leading tokens of the context are in that worker's device /
    host tier. `pool`: how many are in the shared pool (written through by the worker that computed them).
    A belief, not a fact: it is corrected by each turn's cache report and by prefetch outcomes.
    """

    device: dict[str, int] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)
    pool: int = 0
    last_worker: str | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """An advisory left for a session: its KV is being brought to `worker_id`, valid until `expires_at`."""

    worker_id: str
    expires_at: float
    landed: bool = False
    """The prefetch has finished: the KV belief shows the KV on `worker_id`, so the score sees what it saves."""


@dataclass(frozen=True, slots=True)
class RouteRequest:
    session_id: str
    tenant_id: str
    # Estimated length of the request's prompt in tokens (before the worker tokenises it).
    prompt_tokens: int = 0
    # Text the request starts with (cache_aware matches prefixes on it).
    prompt_text: str = ""
    kv: KVResidency = field(default_factory=KVResidency)
    reservation: Reservation | None = None
    now: float = 0.0
