"""Per-tenant limits on chat turns: requests in flight, and tokens per minute.

Both are kept by each gateway replica in its own memory (with N replicas behind a balancer a tenant gets up to N
times the limits; a shared counter would cost a database round trip per request, which the store's per-turn
budget does not have room for). Tokens are counted after the fact, from the usage the worker reports: a turn is
admitted while the tenant's bucket is not empty, and its tokens are taken when it ends, so a tenant may
overshoot by the turns it already has in flight, never by more. A refusal is a 429 with `Retry-After` (the
time until the bucket is positive again, or 1 s for concurrency).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import RateLimited

__all__ = ["Admission", "TenantLimits"]


@dataclass(slots=True)
class _Bucket:
    level: float
    updated_at: float


class Admission:
    """One admitted turn: `charge` its tokens when known, `release` its concurrency slot (idempotent)."""

    def __init__(self, limits: TenantLimits, tenant_id: str) -> None:
        self._limits = limits
        self.tenant_id = tenant_id
        self._released = False

    def charge(self, tokens: int) -> None:
        self._limits.charge(self.tenant_id, tokens)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limits.release(self.tenant_id)


class TenantLimits:
    def __init__(
        self, *, max_concurrent: int, tokens_per_minute: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_concurrent = max_concurrent
        self.tokens_per_minute = tokens_per_minute
        self._clock = clock
        self._in_flight: dict[str, int] = {}
        self._buckets: dict[str, _Bucket] = {}

    def in_flight(self, tenant_id: str) -> int:
        return self._in_flight.get(tenant_id, 0)

    def admit(self, tenant_id: str) -> Admission:
        """Admit one turn of `tenant_id`, or raise `RateLimited`."""
        if self.tokens_per_minute:
            bucket = self._bucket(tenant_id)
            if bucket.level <= 0:
                per_second = self.tokens_per_minute / 60.0
                raise RateLimited(
                    f"Tenant token limit of {self.tokens_per_minute} tokens per minute reached; retry later.",
                    retry_after_s=(1.0 - bucket.level) / per_second,
                    code="tokens_per_minute_exceeded",
                )
        in_flight = self._in_flight.get(tenant_id, 0)
        if self.max_concurrent and in_flight >= self.max_concurrent:
            raise RateLimited(
                f"Tenant limit of {self.max_concurrent} concurrent requests reached; retry later.",
                retry_after_s=1.0,
                code="concurrency_limit_exceeded",
            )
        self._in_flight[tenant_id] = in_flight + 1
        return Admission(self, tenant_id)

    def charge(self, tenant_id: str, tokens: int) -> None:
        if self.tokens_per_minute and tokens > 0:
            self._bucket(tenant_id).level -= tokens

    def release(self, tenant_id: str) -> None:
        left = self._in_flight.get(tenant_id, 0) - 1
        if left > 0:
            self._in_flight[tenant_id] = left
        else:
            self._in_flight.pop(tenant_id, None)

    def _bucket(self, tenant_id: str) -> _Bucket:
        now = self._clock()
        capacity = float(self.tokens_per_minute)
        bucket = self._buckets.get(tenant_id)
        if bucket is None:
            bucket = self._buckets[tenant_id] = _Bucket(level=capacity, updated_at=now)
        else:
            refill = (now - bucket.updated_at) * capacity / 60.0
            bucket.level = min(capacity, bucket.level + refill)
            bucket.updated_at = now
        return bucket
