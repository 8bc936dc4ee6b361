"""State that several gateway replicas must share to behave as one gateway.

Each replica keeps its own copy of the advisor's live advisories, the router's KV belief, the hint quality
figures, the webhook replay cache and the tenants' token buckets. With one replica that is the whole truth; with
several, a typing hint on replica A and the turn on replica B would be recorded as one wasted advisory and one
missed turn, a tenant would get its token limit once per replica, and so on. `SharedState` (base.py) is the
operations those consumers need; `LocalShared` keeps them in the process (the default), `RedisShared` in Redis
(`SESSIONGATE_REDIS_URL`). A Redis failure raises `SharedUnavailable`, and the consumer decides with its own
replica's state for that request: a turn never fails because Redis did.
"""

from __future__ import annotations

from .base import SharedAdvisory, SharedKV, SharedState, SharedTurn, SharedUnavailable
from .local import LocalShared

__all__ = [
    "LocalShared",
    "SharedAdvisory",
    "SharedKV",
    "SharedState",
    "SharedTurn",
    "SharedUnavailable",
    "make_shared",
]


def make_shared(redis_url: str = "", *, prefix: str = "sessiongate:", timeout_s: float = 0.5) -> SharedState:
    """`RedisShared` when a Redis URL is set (redis-py imported only then: the `redis` extra), else `LocalShared`."""
    if not redis_url:
        return LocalShared()
    from .redis_shared import RedisShared

    return RedisShared(redis_url, prefix=prefix, timeout_s=timeout_s)
