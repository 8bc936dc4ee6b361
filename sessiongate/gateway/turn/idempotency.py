"""`Idempotency-Key` on chat requests: a client's retry gets the first result instead of a second turn.

The key is scoped to the tenant and bound to the request: a hash of the body and the session headers. The first
request claims the key in the store before its turn is recorded; when the turn ends well the key is completed
with the answer (and its turn id), when it fails the key is released so the retry runs anew. A retry then finds:
- a completed key with the same request: the stored answer, replayed (as JSON, or as a short SSE stream when the
  request streams), with `idempotent-replayed: true`;
- a key still pending: 409, retry shortly (a duplicate that races the first never makes a second turn);
- the same key with a different request: 400.
The claim names its holder, this gateway's instance id and run. A pending key whose gateway died is taken over as
soon as the store sees that gateway's instance lease end (`instance_lease_s` without a heartbeat; at once when the
instance restarted as a new run or released its lease), and in any case once older than `upstream_read_timeout_s`
(no turn can still be running behind it). A gateway that lost its key that way writes no answer to it and does
not release it. The store holds the claims and the leases, so this holds across replicas sharing it. A completion
or release that finds the store unreachable is retried in the background until it is back (or the key would be
taken over anyway): a key left pending by a live gateway would answer every retry with 409.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sessiongate import sessions
from sessiongate.gateway.errors import Conflict, InvalidRequest

from .assembly import TurnResult

__all__ = ["IDEMPOTENCY_HEADER", "Claim", "LateWrites", "claim_idempotency", "completion_body"]

log = structlog.get_logger(__name__)

IDEMPOTENCY_HEADER = "idempotency-key"
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


@dataclass(frozen=True, slots=True)
class Claim:
    """This request holds the key: complete it with the answer, or release it on failure."""

    store: sessions.SessionStore
    tenant_id: str
    key: str
    holder: sessions.IdempotencyHolder
    stream: bool
    late_writes: LateWrites

    async def complete(self, turn_id: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        response = {"stream": self.stream, "body": body, "headers": headers}

        async def record() -> None:
            completed = await self.store.complete_idempotency_key(
                tenant_id=self.tenant_id, key=self.key, holder=self.holder, turn_id=turn_id, response=response
            )
            if not completed:  # this gateway's lease lapsed and a retry took the key over: its answer is replayed
                log.warning("idempotency_key_lost", turn_id=turn_id)

        await self.late_writes.now_or_later((self.tenant_id, self.key), record, "idempotency_key_not_recorded")

    async def release(self) -> None:
        async def release() -> None:
            await self.store.release_idempotency_key(tenant_id=self.tenant_id, key=self.key, holder=self.holder)

        await self.late_writes.now_or_later((self.tenant_id, self.key), release, "idempotency_key_not_released")


_RETRY_DELAYS_S = (0.25, 0.5, 1.0, 2.0, 5.0)


class LateWrites:
    """Completions and releases of keys retried in the background after the store was unreachable.

    A key left pending by a live gateway answers every retry with 409 until `upstream_read_timeout_s` (its holder
    lives, so no other request takes it over): the write is retried for as long (`retry_for_s`), so that the
    client's retry runs anew (released) or replays the answer (completed) as soon as the store is back. One retry
    per key at a time; `aclose()` (the gateway's shutdown, before the store closes) cancels what is left."""

    def __init__(self, retry_for_s: float) -> None:
        self.retry_for_s = retry_for_s
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def now_or_later(self, key: tuple[str, str], write: Callable[[], Awaitable[None]], failure: str) -> None:
        try:
            await write()
        except sessions.StoreUnavailable as exc:
            running = self._tasks.get(key)
            if running is not None and not running.done():  # already being retried (a release asked twice)
                return
            log.warning(failure, error=str(exc), detail="retried in the background")
            task = self._tasks[key] = asyncio.create_task(self._retry(write, failure))
            task.add_done_callback(lambda done: self._tasks.pop(key) if self._tasks.get(key) is done else None)
        except sessions.StoreError as exc:
            log.error(failure, error=str(exc))

    async def _retry(self, write: Callable[[], Awaitable[None]], failure: str) -> None:
        deadline = time.monotonic() + self.retry_for_s
        for attempt in itertools.count():
            await asyncio.sleep(_RETRY_DELAYS_S[min(attempt, len(_RETRY_DELAYS_S) - 1)])
            try:
                await write()
            except sessions.StoreUnavailable as exc:
                if time.monotonic() > deadline:
                    log.error(failure, error=str(exc), retried_for_s=self.retry_for_s)
                    return
            except sessions.StoreError as exc:
                log.error(failure, error=str(exc))
                return
            else:
                log.info("idempotency_key_written_late", attempts=attempt + 2)
                return

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def completion_body(turn_id: str, created: datetime, result: TurnResult, annotation: dict[str, str]) -> dict[str, Any]:
    """The non-streamed answer for a finished turn, as it is replayed."""
    return {
        "id": f"chatcmpl-{turn_id}",
        "object": "chat.completion",
        "created": int(created.timestamp()),
        "model": result.model,
        "choices": [{"index": 0, "message": result.message, "finish_reason": result.finish_reason}],
        "usage": result.usage,
        "sessiongate": annotation,
    }


async def claim_idempotency(
    request: Request,
    store: sessions.SessionStore,
    *,
    tenant_id: str,
    body: dict[str, Any],
    session_headers: Sequence[str | None],
    holder: sessions.IdempotencyHolder,
    stale_after_s: float,
    lease_s: float,
    late_writes: LateWrites,
) -> Claim | Response | None:
    """None without the header; a `Claim` when this request runs the turn; a replay `Response` otherwise.

    `holder`: this gateway process; `lease_s`: how long an instance lease lasts without a heartbeat (a pending key's
    holder silent that long is dead); `stale_after_s`: how long after its claim any pending key is taken over;
    `late_writes`: where the claim's completion or release is retried when the store is unreachable."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not _KEY.fullmatch(key):
        raise InvalidRequest(
            "Invalid Idempotency-Key: 1-255 printable ASCII characters.", param="Idempotency-Key", code="invalid_key"
        )
    digest = hashlib.sha256(
        orjson.dumps({"body": body, "session": list(session_headers)}, option=orjson.OPT_SORT_KEYS)
    ).hexdigest()
    now = datetime.now(UTC)
    existing = await store.claim_idempotency_key(
        tenant_id=tenant_id,
        key=key,
        request_hash=digest,
        holder=holder,
        now=now,
        stale_before=now - timedelta(seconds=stale_after_s),
        holder_stale_before=now - timedelta(seconds=lease_s),
    )
    if existing is None:
        return Claim(store, tenant_id, key, holder, stream=bool(body.get("stream")), late_writes=late_writes)
    if existing.request_hash != digest:
        raise InvalidRequest(
            "This Idempotency-Key was used with a different request.",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    if existing.status != "done" or existing.response is None:
        raise Conflict(
            "A request with this Idempotency-Key is still in progress; retry shortly.",
            code="idempotency_request_in_progress",
        )
    log.info("idempotent_replay", turn_id=existing.turn_id)
    return _replay(existing.response, body)


def _replay(stored: dict[str, Any], body: dict[str, Any]) -> Response:
    headers = {**stored.get("headers", {}), "idempotent-replayed": "true"}
    answer: dict[str, Any] = stored["body"]
    if not stored.get("stream"):
        return JSONResponse(answer, headers=headers)
    choice = answer["choices"][0]
    chunk = {
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer.get("created", int(time.time())),
        "model": answer.get("model"),
        "choices": [{"index": 0, "delta": choice["message"], "finish_reason": choice["finish_reason"]}],
    }
    events = [chunk]
    if (body.get("stream_options") or {}).get("include_usage") and answer.get("usage") is not None:
        events.append({**chunk, "choices": [], "usage": answer["usage"], "sessiongate": answer.get("sessiongate")})
    payload = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events) + b"data: [DONE]\n\n"
    return Response(payload, media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"})
