"""The least persistence a Python gateway can do per chat turn on SQLite: a yardstick for the gateway's store, not a
store (`benchmarks.floor_proxy --least-store`).

One INSERT of the turn (its new messages) committed before the worker sees it, one UPDATE with its answer committed
after, both group-committed as the gateway's store does (every write queued by the time the file is free shares one
transaction), on the same file settings (WAL, synchronous=NORMAL). What it leaves out is what the gateway's store does
beyond that on every turn: the session's row (its seq claimed with a check that no other writer moved it, its last
activity, its context's digest and length), the resent history compared with the stored context, tool calls
requested and returned, the turn's records. The seq and the new messages come from this process's memory alone, so
it is right only for one writer that sees every turn of its sessions, which is all a yardstick needs.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import orjson

__all__ = ["LeastStore"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS turns (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, seq INTEGER NOT NULL,"
    " status TEXT NOT NULL, input_messages TEXT NOT NULL, request TEXT NOT NULL, received_at TEXT NOT NULL,"
    " output_message TEXT, finish_reason TEXT, prompt_tokens INTEGER, completion_tokens INTEGER, ended_at TEXT,"
    " worker TEXT, dispatched_at TEXT)",
    "CREATE UNIQUE INDEX IF NOT EXISTS turns_session_seq ON turns (session_id, seq)",
)
_BEGIN = (
    "INSERT INTO turns (id, session_id, seq, status, input_messages, request, received_at)"
    " VALUES (?, ?, ?, 'pending', ?, ?, ?)"
)
_END = (
    "UPDATE turns SET status = 'ok', output_message = ?, finish_reason = ?, prompt_tokens = ?, completion_tokens = ?,"
    " ended_at = ?, worker = ?, dispatched_at = ? WHERE id = ? AND status = 'pending'"
)
_FAIL = "UPDATE turns SET status = 'failed', ended_at = ? WHERE id = ? AND status = 'pending'"


class BegunTurn(NamedTuple):
    id: str
    received_at: datetime


class LeastStore:
    """`begin_turn`, `complete_turn` and `fail_turn` with the gateway store's signatures (the parts the floor proxy
    passes)."""

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "temp_store=MEMORY"):
            self._db.execute(f"PRAGMA {pragma}")
        for statement in _SCHEMA:
            self._db.execute(statement)
        self._sessions: dict[str, tuple[int, int]] = {}  # session -> (last seq, messages its context holds)
        self._queue: list[tuple[str, tuple[Any, ...], asyncio.Future[None]]] = []
        self._draining: asyncio.Task[None] | None = None

    async def begin_turn(
        self,
        session_id: str,
        *,
        tenant_id: str,
        create_session: bool,
        messages: Sequence[Mapping[str, Any]],
        request: Mapping[str, Any],
        received_at: datetime,
    ) -> BegunTurn:
        seq, known = self._sessions.get(session_id, (0, 0))
        known = known if known <= len(messages) else 0
        self._sessions[session_id] = (seq + 1, len(messages) + 1)  # and the answer
        turn = BegunTurn("turn_" + secrets.token_hex(12), received_at)
        new = orjson.dumps(list(messages[known:])).decode()
        await self._write(
            _BEGIN, (turn.id, session_id, seq + 1, new, orjson.dumps(request).decode(), received_at.isoformat())
        )
        return turn

    async def complete_turn(
        self,
        turn_id: str,
        *,
        output_message: Mapping[str, Any],
        finish_reason: str | None,
        model: str | None,
        usage: Mapping[str, Any] | None,
        cached_tokens_details: Mapping[str, Any] | None,
        first_token_at: datetime | None,
        ended_at: datetime,
        worker: str | None,
        dispatched_at: datetime | None,
    ) -> None:
        usage = usage or {}
        at = dispatched_at.isoformat() if dispatched_at is not None else None
        output = orjson.dumps(output_message).decode()
        tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
        await self._write(_END, (output, finish_reason, *tokens, ended_at.isoformat(), worker, at, turn_id))

    async def fail_turn(self, turn_id: str, *, ended_at: datetime, **_: Any) -> None:
        await self._write(_FAIL, (ended_at.isoformat(), turn_id))

    async def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._queue.append((sql, params, done))
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # the writes the loop is about to queue join this batch
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for sql, params, _ in batch:
                    self._db.execute(sql, params)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                for *_, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for *_, done in batch:
                if not done.done():
                    done.set_result(None)

    async def close(self) -> None:
        self._db.close()
