"""Workers that keep KV differently share a pool without reading each other's pages (real SGLang, CPU).

Worker A keeps its KV in float32, worker B in bfloat16; both serve the same model under the same name and share
one `file` pool directory. Without a namespace B would find A's pages under the same keys and read float32 bytes
as bfloat16 (the file holds more bytes than B reads, so nothing even fails). With it, A's pages are misses for B.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, start_worker
from sessiongate.sglang_ext.pool_namespace import PoolLayout, namespaced_model_name
from sessiongate.sglang_ext.worker_process import stop_all

from .conftest import prefetch, wait_finished

PAGE = 64


def _layout(**changes: object) -> PoolLayout:
    fields: dict[str, object] = {
        "model": "{}",
        "kv_dtype": "torch.float32",
        "page_size": 64,
        "layout": "page_first_direct",
        "kv_shape": (2, 2, 32, 512),
    }
    return PoolLayout(**{**fields, **changes})  # type: ignore[arg-type]


def test_every_part_of_the_layout_changes_the_namespace() -> None:
    base = namespaced_model_name("tiny", _layout())
    assert base.startswith("tiny-sg")
    assert namespaced_model_name("tiny", _layout()) == base  # workers that agree share
    others = [
        namespaced_model_name("tiny", _layout(kv_dtype="torch.bfloat16")),
        namespaced_model_name("tiny", _layout(page_size=16)),
        namespaced_model_name("tiny", _layout(layout="layer_first")),
        namespaced_model_name("tiny", _layout(kv_shape=(2, 4, 32, 1024))),
        namespaced_model_name("tiny", _layout(model='{"hidden_size": 256}')),
        namespaced_model_name("other", _layout()),
        namespaced_model_name("tiny", _layout(kv_cache_dtype="fp8_e5m2/torch.float8_e5m2")),
        namespaced_model_name("tiny", _layout(kv_scales="5a1e")),
        namespaced_model_name("tiny", _layout(revision="0f1e")),
    ]
    assert len({base, *others}) == 1 + len(others)


@pytest.fixture(scope="module")
def two_dtypes(
    worker_state_dir: Path, tmp_path_factory: pytest.TempPathFactory, free_ports: Callable[[], int]
) -> Iterator[tuple[str, str, Path]]:
    pool = tmp_path_factory.mktemp("mixed-pool")
    workers = [
        start_worker(
            WorkerConfig(
                state_dir=worker_state_dir,
                port=free_ports(),
                pool_dir=pool,
                dtype=dtype,
                served_model_name="tiny",
                log_file=worker_state_dir / f"namespace-{dtype}.log",
                cpu_threads=cores_per_worker(2),
                gpu_share=2,
            )
        )
        for dtype in ("float32", "bfloat16")
    ]
    try:
        for worker in workers:
            worker.wait_ready(300)
        yield workers[0].url, workers[1].url, pool
    finally:
        stop_all(workers)


@pytest.mark.engine
def test_a_worker_with_another_kv_dtype_misses_the_pools_pages(two_dtypes: tuple[str, str, Path]) -> None:
    url_a, url_b, pool = two_dtypes
    prompt = [5 + (i * 11) % 480 for i in range(8 * PAGE + 3)]
    with httpx.Client(base_url=url_a, timeout=120) as worker_a, httpx.Client(base_url=url_b, timeout=120) as worker_b:
        files_before = len(list(pool.iterdir()))
        done = worker_a.post("/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}})
        assert done.status_code == 200, done.text
        deadline = time.monotonic() + 60
        while len(list(pool.iterdir())) < files_before + 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(list(pool.iterdir())) >= files_before + 8  # A's pages are in the pool

        status = wait_finished(
            worker_b, prefetch(worker_b, session_id="ns", input_ids=prompt, target="host").prefetch_id
        )
        assert status.state == "done"
        assert status.pages_in_host == 0  # a miss ...
        assert status.pages_unavailable == 8
        again = worker_b.post(
            "/generate",
            json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}, "return_cached_tokens_details": True},
        )
        assert again.status_code == 200, again.text
        assert again.json()["meta_info"]["cached_tokens"] == 0  # ... never A's bytes, from any tier
