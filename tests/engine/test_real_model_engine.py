"""A real question gets a real answer: SmolLM2-135M-Instruct on a real SGLang CPU worker, through the gateway.

The gateway runs in-process (its real ASGI app and SQLite store) in front of one real SGLang 0.5.23 server that
the launcher started with the converted SmolLM2 model. Greedy decoding, so the answer is the model's best one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess
from tests.conftest import running_worker

pytestmark = [pytest.mark.engine, pytest.mark.anyio]


@pytest.fixture(scope="module")
def smollm2_worker(
    smollm2_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]
) -> Iterator[WorkerProcess]:
    state_dir = tmp_path_factory.mktemp("smollm2-worker")
    config = WorkerConfig(model_path=smollm2_model_dir, state_dir=state_dir, port=free_port(), max_total_tokens=2048)
    with running_worker(config) as process:
        yield process


@pytest.fixture
async def gateway(
    smollm2_worker: WorkerProcess, tmp_path: Path, open_gateway: Callable[..., Any]
) -> AsyncIterator[httpx.AsyncClient]:
    settings = GatewaySettings(
        allow_unauthenticated=True,
        workers=(smollm2_worker.url,),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
    )
    async with open_gateway(create_app(settings)) as client:
        yield client


async def test_a_real_question_gets_a_real_answer(gateway: httpx.AsyncClient) -> None:
    headers = {"X-Session-Id": "paris"}
    question = {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
    body = {"model": "smollm2", "messages": [question], "max_tokens": 24, "temperature": 0}
    response = await gateway.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    answer = response.json()["choices"][0]["message"]["content"]
    assert "Paris" in answer
    assert response.json()["choices"][0]["finish_reason"] == "stop"  # a sentence, ended by the model itself

    # The session's next turn builds on the answer.
    follow_up = {"role": "user", "content": "And what is the capital of Italy? Answer in one sentence."}
    body["messages"] = [question, {"role": "assistant", "content": answer}, follow_up]
    second = await gateway.post("/v1/chat/completions", json=body, headers=headers)
    assert second.status_code == 200, second.text
    assert "Rome" in second.json()["choices"][0]["message"]["content"]

    turns = (await gateway.get("/v1/sessions/paris/turns")).json()["data"]
    assert [turn["status"] for turn in turns] == ["ok", "ok"]
