"""A replica that dies with an `Idempotency-Key` turn in flight: the client's retry on the other replica waits
(409) while the first replica lives, and runs the turn as soon as the dead replica's instance lease lapses, long
before the read timeout; one answered turn, replayed to every later retry. The idempotency keys and the leases are
in the store, so this needs no shared state between the replicas (no Redis)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from .conftest import Replica, running_replicas

pytestmark = pytest.mark.anyio

LEASE_S = 1.0
HEADERS = {"x-session-id": "idem-failover", "idempotency-key": "idem-key-1"}
BODY = {"messages": [{"role": "user", "content": "plan a trip to Lisbon for three days"}]}


async def _post(replica: Replica) -> httpx.Response:
    return await replica.client.post("/v1/chat/completions", json=BODY, headers=HEADERS)


async def test_a_retry_on_the_other_replica_takes_over_once_the_first_ones_lease_lapses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_replicas(tmp_path, instance_lease_s=LEASE_S, upstream_read_timeout_s=300.0) as replicas:
        a, b = replicas.a, replicas.b
        for worker in replicas.workers.values():
            worker.hang = True  # the first attempt never gets an answer

        async with anyio.create_task_group() as group:
            group.start_soon(_post, a)
            with anyio.fail_after(10):
                while not any(w.requests for w in replicas.workers.values()):  # noqa: ASYNC110 (no event to wait on)
                    await anyio.sleep(0.01)
            for worker in replicas.workers.values():
                worker.hang = False

            waiting = await _post(b)
            assert waiting.status_code == 409  # A is alive: its turn may still answer
            assert waiting.json()["error"]["code"] == "idempotency_request_in_progress"

            # A dies as a SIGKILLed process would: its turn stays in flight, its lease is no longer renewed.
            async def no_heartbeat(instance_id: str, *, run: str) -> bool:
                return True

            monkeypatch.setattr(a.state.store, "heartbeat_instance", no_heartbeat)
            died = time.monotonic()
            with anyio.fail_after(30):  # a tenth of the read timeout, after which any pending key is taken over
                while (retry := await _post(b)).status_code == 409:  # noqa: ASYNC110 (polling, as a client would)
                    await anyio.sleep(0.1)
            taken_over_after_s = time.monotonic() - died
            assert retry.status_code == 200, retry.text
            assert "idempotent-replayed" not in retry.headers
            assert LEASE_S / 3 < taken_over_after_s < 30  # after the lease lapsed, long before the read timeout

            turns = await _turns(b)
            assert [t["status"] for t in turns] == ["pending", "ok"]  # A's turn, hung; the retry's, answered
            assert turns[1]["id"] == retry.headers["x-sessiongate-turn-id"]
            group.cancel_scope.cancel()  # A's request ends: its key is the retry's now, so A leaves it alone

        for replica in (a, b):
            replay = await _post(replica)
            assert replay.status_code == 200
            assert replay.headers["idempotent-replayed"] == "true"
            assert replay.headers["x-sessiongate-turn-id"] == retry.headers["x-sessiongate-turn-id"]
            assert replay.json()["choices"][0]["message"] == retry.json()["choices"][0]["message"]
        assert [t["status"] for t in await _turns(b)].count("ok") == 1


async def _turns(replica: Replica) -> list[dict[str, Any]]:
    answer = await replica.client.get(f"/v1/sessions/{HEADERS['x-session-id']}/turns")
    assert answer.status_code == 200, answer.text
    return list(answer.json()["data"])
