"""Mooncake Store as the shared KV pool, on real SGLang 0.5.23 CPU servers and a real `mooncake_master`.

One master on loopback and two tiny-model workers, A and B, that use it as their L3 pool (and share
nothing else) for the whole module. A session's turn 1 runs on A and is written through to Mooncake;
B prefetches it and turn 2 on B starts from that KV. The last test kills the master: the pool is gone,
which must be a cache miss and nothing worse.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, served_model_name, start_worker
from sessiongate.sglang_ext.mooncake import MasterConfig, MooncakeMaster, start_master
from sessiongate.sglang_ext.protocol import LOAD_PATH, LoadReport
from sessiongate.sglang_ext.worker_process import stop_all

from .conftest import answer, chat, long_system_prompt, prefetch, require_mooncake, wait_finished

pytestmark = pytest.mark.engine

require_mooncake()

READY_TIMEOUT = 300.0
PAGE = 64  # WorkerConfig.page_size
GREEDY_4 = {"max_new_tokens": 4, "temperature": 0}
SEGMENT_BYTES = 128 << 20  # each worker's share of the pool: ~1000 pages of the tiny model


@dataclass
class Pool:
    master: MooncakeMaster
    a: httpx.Client
    b: httpx.Client
    a_process: WorkerProcess
    b_process: WorkerProcess


@pytest.fixture(scope="module")
def pool(worker_state_dir: Path, free_ports: Callable[[], int]) -> Iterator[Pool]:
    master_config = MasterConfig(
        rpc_port=free_ports(),
        metadata_port=free_ports(),
        admin_port=free_ports(),
        log_file=worker_state_dir / "mooncake-master.log",
    )
    master = start_master(master_config)
    workers: list[WorkerProcess] = []
    try:
        master.wait_ready()
        for name in ("mooncake-a", "mooncake-b"):
            config = WorkerConfig(
                state_dir=worker_state_dir,
                port=free_ports(),
                mooncake_segment_bytes=SEGMENT_BYTES,
                log_file=worker_state_dir / f"{name}.log",
                cpu_threads=cores_per_worker(2),
                gpu_share=2,
            )
            workers.append(start_worker(master_config.pool_of(config)))
        for worker in workers:
            worker.wait_ready(READY_TIMEOUT)
        with (
            httpx.Client(base_url=workers[0].url, timeout=120.0) as a,
            httpx.Client(base_url=workers[1].url, timeout=120.0) as b,
        ):
            yield Pool(master, a, b, workers[0], workers[1])
    finally:
        stop_all(workers)
        master.stop()


def wait_for_new_keys(master: MooncakeMaster, before: set[str], timeout: float = 60.0) -> set[str]:
    """Write-through reaches the pool in the background; wait until it has stopped growing."""
    deadline = time.monotonic() + timeout
    new: set[str] = set()
    while time.monotonic() < deadline:
        grown = set(master.keys()) - before
        if grown and grown == new:
            return new
        new = grown
        time.sleep(0.5)
    raise AssertionError(f"no new keys settled in the Mooncake pool after {timeout:.0f} s ({len(new)} so far)")


def test_a_session_moves_to_another_worker_through_mooncake(pool: Pool) -> None:
    turn1 = [{"role": "system", "content": long_system_prompt("mooncake")}, {"role": "user", "content": "Page 21?"}]
    before = set(pool.master.keys())
    answer1 = chat(pool.a, turn1)
    new_keys = wait_for_new_keys(pool.master, before)
    # The same hashed page keys as the file pool, prefixed with the served model, the digest of its KV layout
    # (`sglang_ext.pool_namespace`) and the verified format's tag (`internals.page_digest`; SGLang's MooncakeStore
    # stores K and V of a page under two keys).
    served = served_model_name(pool.a_process.config)
    assert served == "tiny"  # the model's name, not this machine's path to it
    namespaces = {key.split("_", 1)[0] for key in new_keys}
    assert len(namespaces) == 1
    assert re.fullmatch(re.escape(served) + r"-sg[0-9a-f]{12}-xxh3s", namespaces.pop())
    assert len(new_keys) == 2 * (answer1["usage"]["prompt_tokens"] // PAGE)

    context = [*turn1, {"role": "assistant", "content": answer(answer1)}]
    turn2 = [*context, {"role": "user", "content": "And page 28?"}]
    accepted = prefetch(pool.b, session_id="mooncake", messages=context, target="device")
    status = wait_finished(pool.b, accepted.prefetch_id)
    assert status.state == "done"
    full_pages = accepted.tokens // PAGE
    assert status.pages_requested == full_pages
    assert status.pages_unavailable == 0
    assert status.pages_on_device + status.pages_in_host == full_pages
    assert status.bytes_loaded > 0

    on_b = chat(pool.b, turn2)
    on_a = chat(pool.a, turn2)
    details = on_b["sglext"]["cached_tokens_details"]
    assert details["storage_backend"] == "GuardedMooncakeStore"
    assert details["storage"] == 0  # all of it was prefetched before the request came
    assert details["device"] + details["host"] >= full_pages * PAGE
    assert answer(on_b) == answer(on_a)


def test_prefetch_to_host_by_token_ids(pool: Pool) -> None:
    prompt = [11 + i % 300 for i in range(10 * PAGE + 3)]
    before = set(pool.master.keys())
    computed = pool.a.post("/generate", json={"input_ids": prompt, "sampling_params": GREEDY_4})
    assert computed.status_code == 200, computed.text
    wait_for_new_keys(pool.master, before)

    status = wait_finished(pool.b, prefetch(pool.b, session_id="ids", input_ids=prompt, target="host").prefetch_id)
    assert (status.state, status.pages_in_host, status.pages_on_device, status.pages_unavailable) == ("done", 10, 0, 0)
    served = pool.b.post(
        "/generate",
        json={"input_ids": prompt, "sampling_params": GREEDY_4, "return_cached_tokens_details": True},
    )
    assert served.status_code == 200, served.text
    assert served.json()["meta_info"]["cached_tokens_details"]["host"] == 10 * PAGE
    assert served.json()["output_ids"] == computed.json()["output_ids"]


def test_cache_salt_keeps_tenants_apart_in_the_pool(pool: Pool) -> None:
    messages = [{"role": "system", "content": long_system_prompt("salted", 30)}, {"role": "user", "content": "Hi"}]
    before = set(pool.master.keys())
    chat(pool.a, messages, cache_salt="tenant-1")
    assert wait_for_new_keys(pool.master, before)

    other_tenant = prefetch(pool.b, session_id="t2", messages=messages, cache_salt="tenant-2")
    assert wait_finished(pool.b, other_tenant.prefetch_id).pages_unavailable == other_tenant.tokens // PAGE
    unsalted = prefetch(pool.b, session_id="t0", messages=messages)
    assert wait_finished(pool.b, unsalted.prefetch_id).pages_unavailable == unsalted.tokens // PAGE
    same_tenant = prefetch(pool.b, session_id="t1", messages=messages, cache_salt="tenant-1")
    status = wait_finished(pool.b, same_tenant.prefetch_id)
    assert status.pages_unavailable == 0
    assert status.pages_on_device + status.pages_in_host == same_tenant.tokens // PAGE


def test_damaged_objects_are_misses_and_the_next_turn_is_recomputed(pool: Pool) -> None:
    from mooncake.store import MooncakeDistributedStore

    messages = [{"role": "system", "content": long_system_prompt("damaged")}, {"role": "user", "content": "Hi"}]
    before = set(pool.master.keys())
    computed = chat(pool.a, messages)
    damaged = wait_for_new_keys(pool.master, before)
    rejected_before = load(pool.b).pool_pages_rejected
    # Another writer (a client lending no memory) overwrites every object of the context with random bytes of the
    # same size: SGLang's own backend would serve them as KV.
    writer = MooncakeDistributedStore()
    master_config = pool.master.config
    assert (
        writer.setup("127.0.0.1", master_config.metadata_server, 0, 16 << 20, "tcp", "", master_config.master_address)
        == 0
    )
    for key in damaged:
        assert writer.upsert(key, os.urandom(writer.get_size(key))) == 0

    accepted = prefetch(pool.b, session_id="damaged", messages=messages, target="host")
    status = wait_finished(pool.b, accepted.prefetch_id)
    assert status.state == "done"
    assert status.pages_unavailable == accepted.tokens // PAGE
    assert status.pages_in_host == status.pages_on_device == 0
    served = chat(pool.b, messages)
    assert served["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert answer(served) == answer(computed)
    # The first page's objects were read (the prefetch stops at the first miss), failed, counted and removed.
    assert load(pool.b).pool_pages_rejected > rejected_before
    assert "failed verification" in pool.b_process.log_file.read_text(errors="replace")


def load(client: httpx.Client) -> LoadReport:
    response = client.get(LOAD_PATH)
    assert response.status_code == 200, response.text
    return LoadReport.model_validate(response.json())


def test_losing_the_master_is_a_cache_miss(pool: Pool) -> None:
    messages = [{"role": "system", "content": long_system_prompt("no-master")}, {"role": "user", "content": "Hi"}]
    before = set(pool.master.keys())
    computed = chat(pool.a, messages)
    assert wait_for_new_keys(pool.master, before)

    pool.master.kill()
    started = time.monotonic()
    served = chat(pool.b, messages)  # B has none of it in memory, and the pool is gone
    first_miss_s = time.monotonic() - started
    assert served["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert answer(served) == answer(computed)
    # Both keep serving, writing through to a pool that is no longer there; B has stopped asking it.
    fresh = [{"role": "system", "content": long_system_prompt("after", 20)}, {"role": "user", "content": "?"}]
    started = time.monotonic()
    on_b = chat(pool.b, fresh)
    next_miss_s = time.monotonic() - started
    assert answer(chat(pool.a, fresh)) == answer(on_b)
    assert "Mooncake master unreachable" in pool.b_process.log_file.read_text(errors="replace")
    print(f"with the master gone: first miss {first_miss_s:.1f} s, the next {next_miss_s:.1f} s")
    assert pool.a_process.poll() is None
    assert pool.b_process.poll() is None


def test_the_guard_stops_asking_a_dead_master(
    cpu_compat: bool, worker_state_dir: Path, free_ports: Callable[[], int]
) -> None:
    from sessiongate.sglang_ext.internals.guarded_mooncake_store import GuardedMooncakeStore
    from sessiongate.sglang_ext.internals.storage_config import single_rank_storage_config

    master_config = MasterConfig(
        rpc_port=free_ports(),
        metadata_port=free_ports(),
        admin_port=free_ports(),
        log_file=worker_state_dir / "guard-master.log",
    )
    with start_master(master_config) as master:
        master.wait_ready()
        storage_config = single_rank_storage_config(
            "guard",
            {
                "master_server_address": master_config.master_address,
                "metadata_server": master_config.metadata_server,
                "global_segment_size": 16 << 20,
                "protocol": "tcp",
                "local_hostname": "127.0.0.1",
            },
        )
        store = GuardedMooncakeStore(storage_config)  # its warm-up puts and gets one object
        assert store.store.put("present", b"x" * 4096) == 0
        assert store._batch_exist(["present", "absent"]) == [1, 0]
        assert store.batch_exists(["page-1", "page-2"]) == 0  # a lookup that reaches the master: timed
        assert store.pool_timing.lookup.figures().calls == 1

        master.kill()
        assert store.batch_exists(["present"]) == 0  # the first call fails at once (RPC_FAIL)
        started = time.monotonic()
        for _ in range(3):
            assert store.batch_exists(["present"]) == 0
        # Unguarded, each of these waits for a reconnect attempt (~4.3 s here).
        assert time.monotonic() - started < 1.0
        # The call that failed counts, with its time; those answered without asking the pool do not.
        lookups = store.pool_timing.lookup.figures()
        assert (lookups.calls, lookups.pages) == (2, 3)
        assert lookups.seconds > 0
