"""The checked `file` pool backend in-process: pages round-trip, damaged pages are misses.

`CheckedFileStore` runs against SGLang 0.5.23's own `HiCacheFile` and storage-backend factory (no
server); the workers that use it are tested in test_pool_checksum_engine.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sessiongate.sglang_ext.launcher import CHECKED_FILE_BACKEND, build_command
from sessiongate.sglang_ext.worker_config import WorkerConfig

PAGE_BYTES = 64 * 512  # one page of 64 tokens, 512 bytes of KV per token


def storage_config(pool: Path) -> Any:
    from sessiongate.sglang_ext.internals.storage_config import single_rank_storage_config

    return single_rank_storage_config("tiny", {"file_storage_path": str(pool)})


@pytest.fixture
def store(cpu_compat: bool, tmp_path: Path) -> Any:
    from sessiongate.sglang_ext.internals.checked_file_store import CheckedFileStore

    return CheckedFileStore(storage_config(tmp_path))


def random_page(seed: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randn(PAGE_BYTES // 4, generator=generator, dtype=torch.float32)


def page_files(pool: Path) -> list[Path]:
    return sorted(pool.glob("*.bin"))


def read_back(store: Any, key: str) -> Any:
    import torch

    return store.get(key, torch.zeros(PAGE_BYTES // 4, dtype=torch.float32))


def test_a_page_round_trips(store: Any, tmp_path: Path) -> None:
    import torch

    page = random_page(1)
    assert store.set("k1", page)
    assert store.exists("k1")
    assert torch.equal(read_back(store, "k1"), page)
    assert store.batch_exists(["k1", "k2"]) == 1
    assert read_back(store, "k2") is None


def test_a_page_overwritten_with_other_bytes_of_the_same_size_is_a_miss(store: Any, tmp_path: Path) -> None:
    assert store.set("k1", random_page(1))
    (page_file,) = page_files(tmp_path)
    size = page_file.stat().st_size
    page_file.write_bytes(os.urandom(size))

    assert read_back(store, "k1") is None
    # Removed, so the next write-through puts the right page back.
    assert not store.exists("k1")
    assert store.set("k1", random_page(1))
    assert read_back(store, "k1") is not None


def test_one_flipped_byte_is_a_miss(store: Any, tmp_path: Path) -> None:
    assert store.set("k1", random_page(1))
    (page_file,) = page_files(tmp_path)
    data = bytearray(page_file.read_bytes())
    data[PAGE_BYTES // 2] ^= 0x01
    page_file.write_bytes(bytes(data))
    assert read_back(store, "k1") is None


def test_a_valid_page_filed_under_another_key_is_a_miss(store: Any, tmp_path: Path) -> None:
    assert store.set("k1", random_page(1))
    assert store.set("k2", random_page(2))
    first, second = (tmp_path / f"{store._get_suffixed_key(key)}.bin" for key in ("k1", "k2"))
    second.write_bytes(first.read_bytes())
    assert read_back(store, "k2") is None
    assert read_back(store, "k1") is not None


@pytest.mark.parametrize("keep", [0, PAGE_BYTES // 2, PAGE_BYTES, PAGE_BYTES + 8])
def test_a_truncated_page_is_a_miss(store: Any, tmp_path: Path, keep: int) -> None:
    assert store.set("k1", random_page(1))
    (page_file,) = page_files(tmp_path)
    with page_file.open("r+b") as handle:
        handle.truncate(keep)
    assert read_back(store, "k1") is None


def test_plain_and_checked_pages_never_mix(cpu_compat: bool, tmp_path: Path) -> None:
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from sessiongate.sglang_ext.internals.checked_file_store import CheckedFileStore

    checked = CheckedFileStore(storage_config(tmp_path))
    plain = HiCacheFile(storage_config(tmp_path))
    assert checked.set("k1", random_page(1))
    assert plain.set("k2", random_page(2))
    assert not plain.exists("k1")
    assert not checked.exists("k2")


def test_the_launcher_loads_it_through_sglangs_dynamic_backend(cpu_compat: bool, tmp_path: Path) -> None:
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from sessiongate.sglang_ext.internals.checked_file_store import CheckedFileStore

    command = build_command(WorkerConfig(state_dir=tmp_path, device="cpu", storage_backend=CHECKED_FILE_BACKEND))
    backend = command[command.index("--hicache-storage-backend") + 1]
    extra = json.loads(command[command.index("--hicache-storage-backend-extra-config") + 1])
    assert backend == "dynamic"
    assert extra["file_storage_path"] == str(tmp_path / "kv-pool")

    config = storage_config(tmp_path)
    config.extra_config = extra
    store = StorageBackendFactory.create_backend(backend, config, mem_pool_host=None)
    assert isinstance(store, CheckedFileStore)
    assert store.file_path == str(tmp_path / "kv-pool")
