"""Per-tenant limits on chat turns: requests in flight, and tokens per minute.

The token buckets are the replicas' shared state (`gateway.shared`): with Redis every replica takes from one
bucket per tenant (a Lua script refills and takes atomically), so the limit holds for the sum of the replicas; while
Redis does not answer, a replica admits by its own bucket, which it charges always. Concurrency is counted by each
replica on its own (with N replicas a tenant may have up to N times `max_concurrent` turns in flight): a shared
count would need a lease per turn to survive a replica's crash. Tokens are counted after the fact, from the usage
the worker reports: a turn is admitted while the tenant's bucket is not empty, and its tokens are taken when it
ends, so a tenant may overshoot by the turns it already has in flight, never by more. A refusal is a 429 with
`Retry-After` (the time until the bucket is positive again, or 1 s for concurrency).

The global values come from the settings; the admin may override either per tenant (stored on the tenant:
`PUT /v1/admin/tenants/{id}/limits`, `sessiongate keys limits`). Each replica holds the overrides in memory,
reloaded from the store every `key_cache_ttl_s` (and at once on the replica that set them), so admission never
waits on the database.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sessiongate import sessions
from sessiongate.gateway.errors import RateLimited
from sessiongate.gateway.shared import SharedState, SharedUnavailable

__all__ = ["Admission", "EffectiveLimits", "TenantLimits"]


@dataclass(frozen=True, slots=True)
class EffectiveLimits:
    """The limits a tenant gets: its overrides where set, the global values elsewhere (0: no limit)."""

    max_concurrent: int
    tokens_per_minute: int


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

    async def charge_shared(self, tokens: int) -> None:
        await self._limits.charge_shared(self.tenant_id, tokens)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limits.release(self.tenant_id)


class TenantLimits:
    def __init__(
        self,
        *,
        max_concurrent: int,
        tokens_per_minute: int,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedState | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.defaults = EffectiveLimits(max_concurrent=max_concurrent, tokens_per_minute=tokens_per_minute)
        self._clock = clock
        # The replicas' shared buckets, or None for this process's own (`admit` / `charge`, no await).
        self.shared = shared if shared is not None and shared.distributed else None
        self._wall = wall
        self._in_flight: dict[str, int] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._overrides: dict[str, EffectiveLimits] = {}

    def for_tenant(self, tenant_id: str) -> EffectiveLimits:
        return self._overrides.get(tenant_id, self.defaults)

    def set_override(self, tenant: sessions.TenantRecord) -> None:
        """Apply one tenant's stored overrides (None fields fall back to the global values)."""
        if tenant.max_concurrent is None and tenant.tokens_per_minute is None:
            self._overrides.pop(tenant.id, None)
            return
        self._overrides[tenant.id] = EffectiveLimits(
            max_concurrent=self.defaults.max_concurrent if tenant.max_concurrent is None else tenant.max_concurrent,
            tokens_per_minute=(
                self.defaults.tokens_per_minute if tenant.tokens_per_minute is None else tenant.tokens_per_minute
            ),
        )

    def replace_overrides(self, tenants: Iterable[sessions.TenantRecord]) -> None:
        """Every tenant's overrides, as the store holds them now (a tenant no longer listed loses its own)."""
        self._overrides.clear()
        for tenant in tenants:
            self.set_override(tenant)

    def in_flight(self, tenant_id: str) -> int:
        return self._in_flight.get(tenant_id, 0)

    def admit(self, tenant_id: str) -> Admission:
        """Admit one turn of `tenant_id` by this replica's own bucket, or raise `RateLimited`."""
        limits = self.for_tenant(tenant_id)
        if limits.tokens_per_minute:
            self._refuse_if_empty(limits, self._bucket(tenant_id, limits.tokens_per_minute).level)
        return self._take_slot(tenant_id, limits)

    async def admit_shared(self, tenant_id: str) -> Admission:
        """`admit` by the replicas' shared bucket (this replica's own while Redis does not answer)."""
        limits = self.for_tenant(tenant_id)
        if limits.tokens_per_minute:
            level = self._bucket(tenant_id, limits.tokens_per_minute).level
            if self.shared is not None:
                try:
                    capacity = float(limits.tokens_per_minute)
                    level = await self.shared.take_tokens(tenant_id, capacity=capacity, amount=0, now=self._wall())
                except SharedUnavailable:
                    pass
            self._refuse_if_empty(limits, level)
        return self._take_slot(tenant_id, limits)

    @staticmethod
    def _refuse_if_empty(limits: EffectiveLimits, level: float) -> None:
        if level <= 0:
            per_second = limits.tokens_per_minute / 60.0
            raise RateLimited(
                f"Tenant token limit of {limits.tokens_per_minute} tokens per minute reached; retry later.",
                retry_after_s=(1.0 - level) / per_second,
                code="tokens_per_minute_exceeded",
            )

    def _take_slot(self, tenant_id: str, limits: EffectiveLimits) -> Admission:
        in_flight = self._in_flight.get(tenant_id, 0)
        if limits.max_concurrent and in_flight >= limits.max_concurrent:
            raise RateLimited(
                f"Tenant limit of {limits.max_concurrent} concurrent requests reached; retry later.",
                retry_after_s=1.0,
                code="concurrency_limit_exceeded",
            )
        self._in_flight[tenant_id] = in_flight + 1
        return Admission(self, tenant_id)

    def charge(self, tenant_id: str, tokens: int) -> None:
        tokens_per_minute = self.for_tenant(tenant_id).tokens_per_minute
        if tokens_per_minute and tokens > 0:
            self._bucket(tenant_id, tokens_per_minute).level -= tokens

    async def charge_shared(self, tenant_id: str, tokens: int) -> None:
        """`charge`, in this replica's bucket (the fallback) and the shared one."""
        self.charge(tenant_id, tokens)
        tokens_per_minute = self.for_tenant(tenant_id).tokens_per_minute
        if self.shared is not None and tokens_per_minute and tokens > 0:
            # Unreachable: charged in this replica's bucket only; the shared one misses these tokens.
            with contextlib.suppress(SharedUnavailable):
                await self.shared.take_tokens(
                    tenant_id, capacity=float(tokens_per_minute), amount=tokens, now=self._wall()
                )

    def release(self, tenant_id: str) -> None:
        left = self._in_flight.get(tenant_id, 0) - 1
        if left > 0:
            self._in_flight[tenant_id] = left
        else:
            self._in_flight.pop(tenant_id, None)

    def _bucket(self, tenant_id: str, tokens_per_minute: int) -> _Bucket:
        """The tenant's bucket, refilled to now; a lowered limit caps what it holds at once."""
        now = self._clock()
        capacity = float(tokens_per_minute)
        bucket = self._buckets.get(tenant_id)
        if bucket is None:
            bucket = self._buckets[tenant_id] = _Bucket(level=capacity, updated_at=now)
        else:
            refill = (now - bucket.updated_at) * capacity / 60.0
            bucket.level = min(capacity, bucket.level + refill)
            bucket.updated_at = now
        return bucket
