"""A device prefetch on a worker whose host-to-device copies finish late, as on a GPU (real SGLang, CPU).

On the CPU build a copy is done when `load_back` returns, so a request that reads a prefetch's pages before
the copy lands cannot be seen. Worker X runs with `SESSIONGATE_CPU_H2D_LAYER_DELAY_S` (`cpu_compat.deferred_copy`):
its loads run on a copy thread, a delay before each layer, into pages zeroed first. On a GPU
(`scripts/gpu-check.sh`) X gets SGLang's own `SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES` instead (a sleep on the copy
stream before each layer). Worker A computes the contexts into the shared `file` pool (the recompute reference);
X prefetches them from the pool into host memory, then to its device, and is asked for the same prompt while the
copy is still running. The answer must be A's: same tokens, same log-probabilities. Six device prefetches at once
must all finish, and X keep serving: SGLang tracks loads in a ring of three slots and asserts when a slot's copy
is still running as it comes round again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.sglang_ext.cpu_compat import H2D_DELAY_ENV
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.worker_process import stop_all

from .conftest import prefetch, wait_finished

pytestmark = pytest.mark.engine

READY_TIMEOUT = 300.0
PAGE = 64
LAYER_DELAY_S = 1.0  # the tiny model has 2 layers: a copy lands 2 s after it starts
# On a GPU: SGLang's per-layer sleep on the copy stream, in GPU clock cycles (about a second on an H100).
GPU_DELAY_CYCLES = os.environ.get("SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES", "1500000000")


def _config(state_dir: Path, pool_dir: Path, port: int, name: str) -> WorkerConfig:
    return WorkerConfig(
        state_dir=state_dir,
        port=port,
        pool_dir=pool_dir,
        log_file=state_dir / f"{name}.log",
        cpu_threads=cores_per_worker(2),
        gpu_share=2,
    )


@pytest.fixture(scope="module")
def race_workers(
    worker_state_dir: Path, tmp_path_factory: pytest.TempPathFactory, free_ports: Callable[[], int]
) -> Iterator[tuple[str, str]]:
    pool_dir = tmp_path_factory.mktemp("race-pool")
    reference = start_worker(_config(worker_state_dir, pool_dir, free_ports(), "race-a"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv(H2D_DELAY_ENV, str(LAYER_DELAY_S))  # the CPU build's deferred copy
        env.setenv("SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES", GPU_DELAY_CYCLES)  # read only on a GPU
        late: WorkerProcess = start_worker(_config(worker_state_dir, pool_dir, free_ports(), "race-x"))
    try:
        reference.wait_ready(READY_TIMEOUT)
        late.wait_ready(READY_TIMEOUT)
        yield reference.url, late.url
    finally:
        stop_all([reference, late])


@pytest.fixture(scope="module")
def worker_a(race_workers: tuple[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=race_workers[0], timeout=120.0) as client:
        yield client


@pytest.fixture(scope="module")
def worker_x(race_workers: tuple[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=race_workers[1], timeout=120.0) as client:
        yield client


def _prompt(seed: int, pages: int) -> list[int]:
    return [3 + (seed * 131 + i * 7) % 500 for i in range(pages * PAGE + 5)]  # the tiny vocabulary: 512 ids


def _generate(client: httpx.Client, prompt: list[int]) -> dict[str, Any]:
    response = client.post(
        "/generate",
        json={
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            "return_logprob": True,
            "return_cached_tokens_details": True,
        },
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _tokens_and_logprobs(result: dict[str, Any]) -> tuple[list[int], list[float]]:
    entries = result["meta_info"]["output_token_logprobs"]
    return [int(entry[1]) for entry in entries], [float(entry[0]) for entry in entries]


def _assert_same_answer(recomputed: dict[str, Any], from_prefetch: dict[str, Any]) -> None:
    tokens, logprobs = _tokens_and_logprobs(from_prefetch)
    want_tokens, want_logprobs = _tokens_and_logprobs(recomputed)
    assert tokens == want_tokens
    assert logprobs == pytest.approx(want_logprobs, abs=1e-3)


def _in_pool_and_host(worker_a: httpx.Client, worker_x: httpx.Client, prompts: list[list[int]]) -> list[dict[str, Any]]:
    """Compute each prompt on A (into the pool), then bring it into X's host memory; A's answers."""
    answers = [_generate(worker_a, prompt) for prompt in prompts]
    for index, prompt in enumerate(prompts):
        full_pages = len(prompt) // PAGE
        deadline = time.monotonic() + 60
        while True:  # A's write-through reaches the pool in the background
            accepted = prefetch(worker_x, session_id=f"host-{index}", input_ids=prompt, target="host")
            status = wait_finished(worker_x, accepted.prefetch_id)
            assert status.state == "done", status
            if status.pages_in_host == full_pages or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status.pages_in_host == full_pages, status
        assert status.pages_on_device == 0
    return answers


def test_a_request_right_after_a_device_prefetch_reads_the_loaded_kv(
    worker_a: httpx.Client, worker_x: httpx.Client
) -> None:
    prompt = _prompt(1, 12)
    (recomputed,) = _in_pool_and_host(worker_a, worker_x, [prompt])

    accepted = prefetch(worker_x, session_id="race", input_ids=prompt, target="device")
    started = time.monotonic()
    answer = _generate(worker_x, prompt)  # the copy lands 2 s after the prefetch started it
    assert time.monotonic() - started < 2 * LAYER_DELAY_S + 10

    assert answer["meta_info"]["cached_tokens_details"]["device"] >= 12 * PAGE  # it read the prefetched pages
    _assert_same_answer(recomputed, answer)
    assert wait_finished(worker_x, accepted.prefetch_id).state == "done"


def test_six_device_prefetches_at_once(worker_a: httpx.Client, worker_x: httpx.Client) -> None:
    prompts = [_prompt(10 + index, 6) for index in range(6)]
    recomputed = _in_pool_and_host(worker_a, worker_x, prompts)

    def start(index: int) -> httpx.Response:
        body = {"session_id": f"six-{index}", "input_ids": prompts[index], "target": "device"}
        return worker_x.post("/sessiongate/v1/prefetch", json=body)

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(start, range(6)))
    assert [response.status_code for response in responses] == [202] * 6, [r.text for r in responses]
    statuses = [wait_finished(worker_x, response.json()["prefetch_id"], timeout=120) for response in responses]
    assert [status.state for status in statuses] == ["done"] * 6, statuses
    assert all(status.pages_on_device == 6 for status in statuses), statuses

    for prompt, reference in zip(prompts, recomputed, strict=True):
        answer = _generate(worker_x, prompt)
        assert answer["meta_info"]["cached_tokens_details"]["device"] >= 6 * PAGE
        _assert_same_answer(reference, answer)
    assert worker_x.get("/health").status_code == 200
