"""The verified `file` pool on real SGLang 0.5.23 CPU servers: a damaged page is a miss, not a wrong answer.

Two tiny-model workers, A and B, share one pool directory with the default pool, `storage_backend="file"`
(sessiongate/sglang_ext/internals/checked_file_store.py, loaded through SGLang's `dynamic` backend). The same with
the real SmolLM2 model: tests/sglang_ext/test_real_model_tiers.py ("from a damaged file pool").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.pool_backends import FILE_BACKEND
from sessiongate.sglang_ext.protocol import (
    INFO_PATH,
    LOAD_PATH,
    LoadReport,
    PrefetchAccepted,
    PrefetchStatus,
    WorkerInfo,
)
from sessiongate.sglang_ext.worker_process import stop_all

from .conftest import answer, chat, long_system_prompt, prefetch, wait_finished

pytestmark = pytest.mark.engine

READY_TIMEOUT = 300.0
PAGE = 64  # WorkerConfig.page_size


def prefetch_and_wait(client: httpx.Client, **body: Any) -> tuple[PrefetchAccepted, PrefetchStatus]:
    accepted = prefetch(client, **body)
    return accepted, wait_finished(client, accepted.prefetch_id)


def new_pages(pool: Path, before: set[Path], timeout: float = 60.0) -> set[Path]:
    """Write-through reaches the pool in the background (a file per page); wait until it settles."""
    deadline = time.monotonic() + timeout
    grown: set[Path] = set()
    while time.monotonic() < deadline:
        now = set(pool.glob("*.bin")) - before
        if now and now == grown:
            return grown
        grown = now
        time.sleep(0.5)
    raise AssertionError(f"no new page files settled in {pool} after {timeout:.0f} s")


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checked-kv-pool")


@pytest.fixture(scope="module")
def workers(
    worker_state_dir: Path, pool_dir: Path, free_ports: Callable[[], int]
) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    started: list[WorkerProcess] = []
    try:
        for name in ("checked-a", "checked-b"):
            config = WorkerConfig(
                state_dir=worker_state_dir,
                port=free_ports(),
                pool_dir=pool_dir,
                log_file=worker_state_dir / f"{name}.log",
                cpu_threads=cores_per_worker(2),
                gpu_share=2,
            )
            started.append(start_worker(config))
        for worker in started:
            worker.wait_ready(READY_TIMEOUT)
        with (
            httpx.Client(base_url=started[0].url, timeout=120.0) as a,
            httpx.Client(base_url=started[1].url, timeout=120.0) as b,
        ):
            yield a, b
    finally:
        stop_all(started)


def rejected(client: httpx.Client) -> int:
    response = client.get(LOAD_PATH)
    assert response.status_code == 200, response.text
    return LoadReport.model_validate(response.json()).pool_pages_rejected


def test_checked_pages_are_served_from_the_pool(workers: tuple[httpx.Client, httpx.Client], pool_dir: Path) -> None:
    a, b = workers
    assert WorkerInfo.model_validate(b.get(INFO_PATH).json()).storage_backend == FILE_BACKEND
    messages = [{"role": "system", "content": long_system_prompt("checked")}, {"role": "user", "content": "Hi"}]
    before = set(pool_dir.glob("*.bin"))
    computed = chat(a, messages)
    assert new_pages(pool_dir, before)

    accepted, status = prefetch_and_wait(b, session_id="checked", messages=messages, target="host")
    full_pages = accepted.tokens // PAGE
    assert (status.state, status.pages_in_host, status.pages_unavailable) == ("done", full_pages, 0)
    served = chat(b, messages)
    assert served["sglext"]["cached_tokens_details"]["host"] == full_pages * PAGE
    assert answer(served) == answer(computed)
    assert all(path.name.endswith(".bin") and "-xxh3s_" in path.name for path in pool_dir.glob("*.bin"))
    assert rejected(b) == 0


def test_a_page_overwritten_with_same_size_bytes_is_a_miss(
    workers: tuple[httpx.Client, httpx.Client], pool_dir: Path
) -> None:
    a, b = workers
    messages = [{"role": "system", "content": long_system_prompt("damaged")}, {"role": "user", "content": "Hi"}]
    before = set(pool_dir.glob("*.bin"))
    computed = chat(a, messages)
    written = new_pages(pool_dir, before)
    for page_file in written:
        page_file.write_bytes(os.urandom(page_file.stat().st_size))
    rejected_before = rejected(b)

    accepted, status = prefetch_and_wait(b, session_id="damaged", messages=messages, target="host")
    assert status.state == "done"
    assert status.pages_unavailable == accepted.tokens // PAGE
    assert status.pages_in_host == status.pages_on_device == 0
    served = chat(b, messages)
    assert served["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert answer(served) == answer(computed)
    assert rejected(b) > rejected_before
    # The damaged files were dropped, and B's write-through of its recomputed KV put them back.
    rewritten = new_pages(pool_dir, before)
    assert {path.name for path in rewritten} == {path.name for path in written}


def test_pages_swapped_between_two_sessions_are_misses(
    workers: tuple[httpx.Client, httpx.Client], pool_dir: Path
) -> None:
    a, b = workers
    alice = [{"role": "system", "content": long_system_prompt("swap1")}, {"role": "user", "content": "Hi"}]
    bob = [{"role": "system", "content": long_system_prompt("swap2")}, {"role": "user", "content": "Hi"}]
    before = set(pool_dir.glob("*.bin"))
    alice_computed = chat(a, alice)
    alice_pages = new_pages(pool_dir, before)
    bob_computed = chat(a, bob)
    bob_pages = new_pages(pool_dir, before | alice_pages)
    # Same-size pages, each a valid page of the other session, under the other's names (both contexts are as
    # many tokens long: every page of each is swapped).
    for alice_page, bob_page in zip(sorted(alice_pages), sorted(bob_pages), strict=True):
        alice_bytes = alice_page.read_bytes()
        alice_page.write_bytes(bob_page.read_bytes())
        bob_page.write_bytes(alice_bytes)
    rejected_before = rejected(b)

    for session, messages, computed in (("alice", alice, alice_computed), ("bob", bob, bob_computed)):
        _, status = prefetch_and_wait(b, session_id=session, messages=messages, target="host")
        assert status.state == "done"
        assert status.pages_in_host == status.pages_on_device == 0
        served = chat(b, messages)
        assert served["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert answer(served) == answer(computed)
    assert rejected(b) > rejected_before
