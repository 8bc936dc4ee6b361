"""The least store (`benchmarks.least_store`), the yardstick the stored floor is compared with, records what it
claims: each turn pending before its answer, then ok with it, the session's seqs in order, each turn's new messages
only, and a failed turn as failed."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from sessiongate.benchmarks.least_store import LeastStore

pytestmark = pytest.mark.anyio


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT session_id, seq, status, input_messages, output_message FROM turns ORDER BY session_id, seq"
        ).fetchall()


async def test_each_turn_is_pending_then_ok_with_its_new_messages_and_a_failed_one_is_failed(tmp_path: Path) -> None:
    path = tmp_path / "least.db"
    store = LeastStore(str(path))
    now = datetime.now(UTC)
    first = [{"role": "user", "content": "one"}]
    begun = await store.begin_turn("s", tenant_id="t", create_session=True, messages=first, request={}, received_at=now)
    assert _rows(path) == [("s", 1, "pending", orjson.dumps(first).decode(), None)]  # committed before the answer
    answer = {"role": "assistant", "content": "two"}
    await store.complete_turn(
        begun.id,
        output_message=answer,
        finish_reason="stop",
        model=None,
        usage={"prompt_tokens": 3, "completion_tokens": 1},
        cached_tokens_details=None,
        first_token_at=None,
        ended_at=now,
        worker="w",
        dispatched_at=now,
    )
    second = [*first, answer, {"role": "user", "content": "three"}]
    begun = await store.begin_turn(
        "s", tenant_id="t", create_session=True, messages=second, request={}, received_at=now
    )
    await store.fail_turn(begun.id, ended_at=now)
    await store.close()
    assert _rows(path) == [
        ("s", 1, "ok", orjson.dumps(first).decode(), orjson.dumps(answer).decode()),
        ("s", 2, "failed", orjson.dumps(second[2:]).decode(), None),
    ]
