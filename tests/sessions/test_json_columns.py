"""JSON columns go through orjson with the stdlib behind it: what orjson refuses still round-trips."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sessiongate.sessions import SqlSessionStore
from sessiongate.sessions.database import json_dumps, json_loads

pytestmark = pytest.mark.anyio


def test_the_serializer_falls_back_for_what_orjson_refuses() -> None:
    for value in ({"content": "x\ud800"}, {"n": 2**70}, {1: "int key"}):
        assert json_loads(json_dumps(value)) == ({"1": "int key"} if 1 in value else value)
    assert json_loads('{"x": NaN}')["x"] != json_loads('{"x": NaN}')["x"]  # written by the stdlib, read back


async def test_a_message_with_a_lone_surrogate_is_stored_and_read_back(store: SqlSessionStore) -> None:
    messages = [{"role": "user", "content": "broken \ud800 text"}]
    turn = await store.begin_turn(
        "sess_surrogate",
        tenant_id="t",
        create_session=True,
        messages=messages,
        request={"model": "m", "big": 2**70},
        received_at=datetime.now(UTC),
    )
    await store.complete_turn(
        turn.id,
        output_message={"role": "assistant", "content": "ok \udfff"},
        finish_reason="stop",
        model="m",
        ended_at=datetime.now(UTC),
    )
    assert await store.session_context("sess_surrogate", tenant_id="t") == [
        *messages,
        {"role": "assistant", "content": "ok \udfff"},
    ]
