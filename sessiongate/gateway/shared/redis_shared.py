"""`RedisShared`: the replicas' shared state in Redis (redis-py asyncio), every key under one prefix.

    {prefix}adv:{session}     hash: the session's live advisory (`SharedAdvisory`), kept `keep_s` past its expiry
                              so the owner can settle it; claimed by a Lua script (check expiry, read, delete,
                              leave a marker)
    {prefix}claimed:{id}      the marker: advisory `id` was claimed by a turn (whose replica settles it)
    {prefix}fires:{owner}     list: `id session` of the advisories another replica asked `owner` to fire now
                              (queued by the same script that marks the record's `fire_requested_at`)
    {prefix}kv:{session}      JSON: the session's KV belief, expiring with the belief's host ttl
    {prefix}bucket:{tenant}   hash: token bucket level and update time, refilled and taken by a Lua script
    {prefix}once:{key}        SET NX PX: the webhook replay cache
    {prefix}q:{key}           list: recent hint outcomes (`ts:0|1`), trimmed to a maximum
    {prefix}stats:{name}      hash: advisory counters (HINCRBYFLOAT)

Every multi-step change is one Lua script, so two replicas never interleave inside it. A failed call (refused,
timed out, any Redis error) raises `SharedUnavailable` after logging it, and for `retry_after_s` the next calls
raise at once without trying: a Redis outage costs each turn nothing beyond deciding locally, not a timeout each.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from .base import EndState, SharedAdvisory, SharedKV, SharedTurn, SharedUnavailable

__all__ = ["RedisShared"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

# How long a claim marker outlives the claim: longer than any advisory's owner takes to notice its expiry.
_MARKER_MS = 3_600_000

# A turn's one round trip: claim the advisory (KEYS[1]) if unexpired, and read the KV belief (KEYS[2]).
# ARGV: now, the prefix of the claim markers, how long a marker stays (ms). One script rather than a pipeline:
# redis-py checks a pipeline's scripts with SCRIPT EXISTS on every execution, a second round trip.
_BEGIN_TURN = """
local kv = redis.call('GET', KEYS[2])
local expires = redis.call('HGET', KEYS[1], 'expires_at')
if not expires or tonumber(expires) <= tonumber(ARGV[1]) then return {false, kv} end
local record = redis.call('HGETALL', KEYS[1])
local id = redis.call('HGET', KEYS[1], 'id')
redis.call('DEL', KEYS[1])
redis.call('SET', ARGV[2] .. id, '1', 'PX', ARGV[3])
return {record, kv}
"""

_UPDATE = """
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires_at'))
redis.call('PEXPIREAT', KEYS[1], math.floor((expires + tonumber(ARGV[2])) * 1000))
return 1
"""

# KEYS: the advisory, its claim marker. Not this advisory any more: claimed (the claimer settles it) or not.
_END = """
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then
  if redis.call('EXISTS', KEYS[2]) == 1 then return {'gone'} end
  return {'ended'}
end
local record = redis.call('HGETALL', KEYS[1])
if tonumber(redis.call('HGET', KEYS[1], 'expires_at')) > tonumber(ARGV[2]) then return {'extended', record} end
redis.call('DEL', KEYS[1])
return {'ended', record}
"""

# A tool result on a replica that does not own the session's advisory (KEYS[1]): mark it and queue it for its owner,
# once, while it is unexpired and not fired. ARGV: now, the least new expiry, keep_s, the prefix of the owners'
# queues, how long a queue stays (ms). Returns the record as changed, or false.
_REQUEST_FIRE = """
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires_at'))
if not expires or expires <= tonumber(ARGV[1]) or redis.call('HGET', KEYS[1], 'fired') == '1' then return false end
local asked = redis.call('HGET', KEYS[1], 'fire_requested_at')
if asked and asked ~= '' then return false end
expires = math.max(expires, tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'fire_requested_at', ARGV[1], 'expires_at', ('%.17g'):format(expires), 'stopped', '0')
redis.call('PEXPIREAT', KEYS[1], math.floor((expires + tonumber(ARGV[3])) * 1000))
local queue = ARGV[4] .. redis.call('HGET', KEYS[1], 'owner')
redis.call('RPUSH', queue, redis.call('HGET', KEYS[1], 'id') .. ' ' .. redis.call('HGET', KEYS[1], 'session_id'))
redis.call('PEXPIRE', queue, ARGV[5])
return redis.call('HGETALL', KEYS[1])
"""

_TAKE = """
local capacity, amount, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local level = tonumber(redis.call('HGET', KEYS[1], 'level'))
local updated = tonumber(redis.call('HGET', KEYS[1], 'updated'))
if level == nil or updated == nil then level, updated = capacity, now end
local elapsed = math.max(now - updated, 0)
level = math.min(capacity, level + elapsed * capacity / 60.0) - amount
local exact = '%.17g'
redis.call('HSET', KEYS[1], 'level', exact:format(level), 'updated', exact:format(math.max(now, updated)))
redis.call('PEXPIRE', KEYS[1], math.ceil(((capacity - level) * 60.0 / capacity + 1) * 1000))
return exact:format(level)
"""


def _encode_advisory(record: SharedAdvisory) -> dict[str, str]:
    return {name: _encode(getattr(record, name)) for name in SharedAdvisory.__slots__}


def _encode(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _decode_advisory(flat: Sequence[str]) -> SharedAdvisory:
    raw = dict(zip(flat[::2], flat[1::2], strict=True))

    def optional(name: str) -> str | None:
        return raw.get(name) or None

    ready, loaded, asked = optional("ready_at"), optional("bytes_loaded"), optional("fire_requested_at")
    return SharedAdvisory(
        id=raw["id"],
        session_id=raw["session_id"],
        tenant_id=raw["tenant_id"],
        kind=raw["kind"],
        worker_id=raw["worker_id"],
        worker_url=raw["worker_url"],
        target=raw["target"],
        owner=raw["owner"],
        expires_at=float(raw["expires_at"]),
        fired=raw.get("fired") == "1",
        ready_at=None if ready is None else float(ready),
        failed=raw.get("failed") == "1",
        stopped=raw.get("stopped") == "1",
        bytes_loaded=None if loaded is None else int(loaded),
        fire_requested_at=None if asked is None else float(asked),
        fired_early=raw.get("fired_early") == "1",
    )


def _encode_kv(kv: SharedKV) -> bytes:
    return orjson.dumps(
        {
            "workers": {w: list(v) for w, v in kv.workers.items()},
            "pool": kv.pool,
            "last_worker": kv.last_worker,
            "context_tokens": kv.context_tokens,
            "last_report": kv.last_report,
        }
    )


def _decode_kv(raw: str | bytes | None) -> SharedKV | None:
    if not raw:
        return None
    data = orjson.loads(raw)
    return SharedKV(
        workers={w: (int(v[0]), str(v[1]), float(v[2])) for w, v in data["workers"].items()},
        pool=int(data["pool"]),
        last_worker=data["last_worker"],
        context_tokens=int(data["context_tokens"]),
        last_report=data["last_report"],
    )


class RedisShared:
    distributed = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "sessiongate:",
        timeout_s: float = 0.5,
        retry_after_s: float = 1.0,
        client: aioredis.Redis | None = None,
    ) -> None:
        self.prefix = prefix
        self.retry_after_s = retry_after_s
        self._redis = client or aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
        )
        self._begin_turn = self._redis.register_script(_BEGIN_TURN)
        self._update = self._redis.register_script(_UPDATE)
        self._end = self._redis.register_script(_END)
        self._take = self._redis.register_script(_TAKE)
        self._request_fire = self._redis.register_script(_REQUEST_FIRE)
        self._down_until = 0.0
        self.failures = 0

    @property
    def available(self) -> bool:
        return not self._down_until

    async def _call(self, operation: str, work: Callable[[], Awaitable[T]]) -> T:
        if self._down_until and time.monotonic() < self._down_until:
            raise SharedUnavailable(f"Redis unavailable (retrying in {self.retry_after_s} s)")
        try:
            result = await work()
        except (RedisError, OSError, TimeoutError) as exc:
            if not self._down_until:
                log.warning("shared_state_unavailable", operation=operation, error=str(exc) or type(exc).__name__)
            self._down_until = time.monotonic() + self.retry_after_s
            self.failures += 1
            raise SharedUnavailable(str(exc) or type(exc).__name__) from exc
        if self._down_until:
            self._down_until = 0.0
            log.info("shared_state_recovered", operation=operation)
        return result

    async def ping(self) -> bool:
        return bool(await self._call("ping", self._redis.ping))

    # advisories

    def _adv(self, session_id: str) -> str:
        return f"{self.prefix}adv:{session_id}"

    async def begin_turn(self, session_id: str, now: float) -> SharedTurn:
        keys = [self._adv(session_id), f"{self.prefix}kv:{session_id}"]
        args: list[str | float] = [now, f"{self.prefix}claimed:", _MARKER_MS]
        claimed, kv = await self._call("begin_turn", lambda: self._begin_turn(keys=keys, args=args))
        return SharedTurn(advisory=_decode_advisory(claimed) if claimed else None, kv=_decode_kv(kv))

    async def put_advisory(self, record: SharedAdvisory, *, keep_s: float) -> None:
        key = self._adv(record.session_id)

        async def work() -> None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping=_encode_advisory(record))  # type: ignore[arg-type]
                pipe.pexpireat(key, int((record.expires_at + keep_s) * 1000))
                await pipe.execute()

        await self._call("put_advisory", work)

    async def update_advisory(self, session_id: str, advisory_id: str, keep_s: float, **changes: Any) -> bool:
        args: list[str] = [advisory_id, str(keep_s)]
        for name, value in changes.items():
            args += [name, _encode(value)]
        done = await self._call("update_advisory", lambda: self._update(keys=[self._adv(session_id)], args=args))
        return bool(done)

    async def get_advisory(self, session_id: str) -> SharedAdvisory | None:
        raw = await self._call("get_advisory", lambda: self._redis.hgetall(self._adv(session_id)))
        if not raw:
            return None
        return _decode_advisory([x for pair in cast(dict[str, str], raw).items() for x in pair])

    async def request_fire(
        self, session_id: str, *, expires_at: float, now: float, keep_s: float
    ) -> SharedAdvisory | None:
        args: list[str | float] = [repr(now), repr(expires_at), keep_s, f"{self.prefix}fires:", int(keep_s * 1000)]
        record = await self._call("request_fire", lambda: self._request_fire(keys=[self._adv(session_id)], args=args))
        return _decode_advisory(record) if record else None

    async def fire_requests(self, owner: str) -> list[tuple[str, str]]:
        key = f"{self.prefix}fires:{owner}"

        async def work() -> list[Any]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.lrange(key, 0, -1)
                pipe.delete(key)
                return await pipe.execute()

        queued, _ = await self._call("fire_requests", work)
        requests = []
        for item in queued:
            advisory_id, _, session_id = str(item).partition(" ")
            requests.append((session_id, advisory_id))
        return requests

    async def end_advisory(
        self, session_id: str, advisory_id: str, now: float
    ) -> tuple[EndState, SharedAdvisory | None]:
        keys = [self._adv(session_id), f"{self.prefix}claimed:{advisory_id}"]
        reply = await self._call("end_advisory", lambda: self._end(keys=keys, args=[advisory_id, now]))
        state = cast(EndState, reply[0])
        return state, _decode_advisory(reply[1]) if len(reply) > 1 else None

    # KV belief

    async def put_kv(self, session_id: str, kv: SharedKV, *, ttl_s: float) -> None:
        key = f"{self.prefix}kv:{session_id}"
        await self._call("put_kv", lambda: self._redis.set(key, _encode_kv(kv), px=max(int(ttl_s * 1000), 1)))

    async def drop_kv(self, session_id: str) -> None:
        await self._call("drop_kv", lambda: self._redis.delete(f"{self.prefix}kv:{session_id}"))

    # limits, replay cache, quality, counters

    async def take_tokens(self, tenant_id: str, *, capacity: float, amount: float, now: float) -> float:
        key = f"{self.prefix}bucket:{tenant_id}"
        level = await self._call("take_tokens", lambda: self._take(keys=[key], args=[capacity, amount, now]))
        return float(level)

    async def set_if_absent(self, key: str, *, ttl_s: float) -> bool:
        full = f"{self.prefix}once:{key}"
        done = await self._call(
            "set_if_absent", lambda: self._redis.set(full, "1", nx=True, px=max(int(ttl_s * 1000), 1))
        )
        return bool(done)

    async def add_sample(self, keys: Sequence[str], sample: tuple[float, bool], *, max_len: int, ttl_s: float) -> None:
        value = f"{sample[0]!r}:{int(sample[1])}"

        async def work() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    full = f"{self.prefix}q:{key}"
                    pipe.rpush(full, value)
                    pipe.ltrim(full, -max_len, -1)
                    pipe.pexpire(full, max(int(ttl_s * 1000), 1))
                await pipe.execute()

        await self._call("add_sample", work)

    async def samples(self, keys: Sequence[str]) -> list[list[tuple[float, bool]]]:
        async def work() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.lrange(f"{self.prefix}q:{key}", 0, -1)
                return await pipe.execute()

        lists = await self._call("samples", work)
        out: list[list[tuple[float, bool]]] = []
        for raw in lists:
            parsed = []
            for item in raw:
                at, _, wasted = str(item).rpartition(":")
                parsed.append((float(at), wasted == "1"))
            out.append(parsed)
        return out

    async def incr(self, key: str, counts: Mapping[str, float]) -> None:
        full = f"{self.prefix}stats:{key}"

        async def work() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name, by in counts.items():
                    pipe.hincrbyfloat(full, name, by)
                await pipe.execute()

        await self._call("incr", work)

    async def counters(self, key: str) -> dict[str, float]:
        raw = await self._call("counters", lambda: self._redis.hgetall(f"{self.prefix}stats:{key}"))
        return {k: float(v) for k, v in cast(dict[str, str], raw).items()}

    async def aclose(self) -> None:
        await self._redis.aclose()
