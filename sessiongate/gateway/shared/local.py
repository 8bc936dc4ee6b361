"""`LocalShared`: the shared state of one process, in its memory. The default, and the reference implementation.

It has the same semantics as `RedisShared` (the contract tests run both), but the gateway does not call its
per-turn operations: with one process, the advisor's book, the router's KV belief and the tenant buckets already
hold everything, so `distributed` is False and the chat path reads them directly, as it did before this layer
existed. Off the chat path (the webhook replay cache) the gateway uses it like any backend. Entries expire
lazily, when read, and the replay cache is swept as it grows.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import EndState, SharedAdvisory, SharedKV, SharedTurn

__all__ = ["LocalShared"]


class LocalShared:
    distributed = False
    available = True
    failures = 0

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._advisories: dict[str, tuple[SharedAdvisory, float]] = {}  # session -> (record, kept until)
        self._kv: dict[str, tuple[SharedKV, float]] = {}
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (level, updated at)
        self._once: dict[str, float] = {}  # key -> kept until
        self._claimed: dict[str, float] = {}  # advisory ids a turn claimed -> kept until
        self._samples: dict[str, deque[tuple[float, bool]]] = {}
        self._counters: dict[str, dict[str, float]] = {}
        self._fire_requests: dict[str, list[tuple[str, str]]] = {}  # owner -> (session, advisory id)

    def _advisory(self, session_id: str) -> SharedAdvisory | None:
        held = self._advisories.get(session_id)
        if held is None:
            return None
        if held[1] <= self._clock():
            del self._advisories[session_id]
            return None
        return held[0]

    async def ping(self) -> bool:
        return True

    async def begin_turn(self, session_id: str, now: float) -> SharedTurn:
        record = self._advisory(session_id)
        claimed = None
        if record is not None and record.expires_at > now:
            claimed = record
            del self._advisories[session_id]
            self._remember(self._claimed, record.id, 3600.0)
        kv = self._kv.get(session_id)
        return SharedTurn(advisory=claimed, kv=kv[0] if kv and kv[1] > self._clock() else None)

    async def put_advisory(self, record: SharedAdvisory, *, keep_s: float) -> None:
        self._advisories[record.session_id] = (record, record.expires_at + keep_s)

    async def update_advisory(self, session_id: str, advisory_id: str, keep_s: float, **changes: Any) -> bool:
        record = self._advisory(session_id)
        if record is None or record.id != advisory_id:
            return False
        record = dataclasses.replace(record, **changes)
        self._advisories[session_id] = (record, record.expires_at + keep_s)
        return True

    async def get_advisory(self, session_id: str) -> SharedAdvisory | None:
        return self._advisory(session_id)

    async def request_fire(
        self, session_id: str, *, expires_at: float, now: float, keep_s: float
    ) -> SharedAdvisory | None:
        record = self._advisory(session_id)
        if record is None or record.expires_at <= now or record.fired or record.fire_requested_at is not None:
            return None
        record = dataclasses.replace(
            record, fire_requested_at=now, expires_at=max(record.expires_at, expires_at), stopped=False
        )
        self._advisories[session_id] = (record, record.expires_at + keep_s)
        self._fire_requests.setdefault(record.owner, []).append((session_id, record.id))
        return record

    async def fire_requests(self, owner: str) -> list[tuple[str, str]]:
        return self._fire_requests.pop(owner, [])

    async def end_advisory(
        self, session_id: str, advisory_id: str, now: float
    ) -> tuple[EndState, SharedAdvisory | None]:
        record = self._advisory(session_id)
        if record is None or record.id != advisory_id:
            return ("gone" if self._claimed.get(advisory_id, 0.0) > self._clock() else "ended"), None
        if record.expires_at > now:
            return "extended", record
        del self._advisories[session_id]
        return "ended", record

    async def put_kv(self, session_id: str, kv: SharedKV, *, ttl_s: float) -> None:
        self._kv[session_id] = (kv, self._clock() + ttl_s)

    async def drop_kv(self, session_id: str) -> None:
        self._kv.pop(session_id, None)

    async def take_tokens(self, tenant_id: str, *, capacity: float, amount: float, now: float) -> float:
        level, updated = self._buckets.get(tenant_id, (capacity, now))
        level = min(capacity, level + max(now - updated, 0.0) * capacity / 60.0) - amount
        self._buckets[tenant_id] = (level, now)
        return level

    def _remember(self, held: dict[str, float], key: str, ttl_s: float) -> None:
        now = self._clock()
        if len(held) > 1024:  # swept as it grows: bounded by the rate of new keys
            for old in [k for k, until in held.items() if until <= now]:
                del held[old]
        held[key] = now + ttl_s

    async def set_if_absent(self, key: str, *, ttl_s: float) -> bool:
        if self._once.get(key, 0.0) > self._clock():
            return False
        self._remember(self._once, key, ttl_s)
        return True

    async def add_sample(self, keys: Sequence[str], sample: tuple[float, bool], *, max_len: int, ttl_s: float) -> None:
        for key in keys:
            self._samples.setdefault(key, deque(maxlen=max_len)).append(sample)

    async def samples(self, keys: Sequence[str]) -> list[list[tuple[float, bool]]]:
        return [list(self._samples.get(key, ())) for key in keys]

    async def incr(self, key: str, counts: Mapping[str, float]) -> None:
        held = self._counters.setdefault(key, {})
        for name, by in counts.items():
            held[name] = held.get(name, 0) + by

    async def counters(self, key: str) -> dict[str, float]:
        return dict(self._counters.get(key, {}))

    async def aclose(self) -> None:
        return None
