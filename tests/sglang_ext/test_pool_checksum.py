"""The verified `file` pool backend in-process: pages round-trip, damaged pages are misses, counted.

`CheckedFileStore` (the default `file` pool) runs against SGLang 0.5.23's own `HiCacheFile` and storage-backend
factory (no server); the workers that use it are tested in test_pool_checksum_engine.py, the Mooncake pool's
verification in test_pool_checksum_mooncake.py.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from sessiongate.sglang_ext.launcher import build_command
from sessiongate.sglang_ext.pool_backends import FILE_BACKEND, UNCHECKED_FILE_BACKEND
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


def page_file(store: Any, pool: Path, key: str) -> Path:
    return pool / f"{store._get_suffixed_key(key)}.bin"


def read_back(store: Any, key: str) -> Any:
    import torch

    return store.get(key, torch.zeros(PAGE_BYTES // 4, dtype=torch.float32))


def write_session(store: Any, session: str, pages: int, seed: int) -> list[str]:
    keys = [f"{session}-page-{i}" for i in range(pages)]
    for i, key in enumerate(keys):
        assert store.set(key, random_page(seed + i))
    return keys


def test_a_page_round_trips(store: Any, tmp_path: Path) -> None:
    import torch

    page = random_page(1)
    assert store.set("k1", page)
    assert store.exists("k1")
    assert torch.equal(read_back(store, "k1"), page)
    assert store.batch_exists(["k1", "k2"]) == 1
    assert read_back(store, "k2") is None
    assert store.pages_rejected == 0


def test_a_page_overwritten_with_other_bytes_of_the_same_size_is_a_miss(store: Any, tmp_path: Path) -> None:
    assert store.set("k1", random_page(1))
    (damaged,) = page_files(tmp_path)
    damaged.write_bytes(os.urandom(damaged.stat().st_size))

    assert read_back(store, "k1") is None
    assert store.pages_rejected == 1
    # Removed, so the next write-through puts the right page back.
    assert not store.exists("k1")
    assert store.set("k1", random_page(1))
    assert read_back(store, "k1") is not None
    assert store.pages_rejected == 1


def test_one_flipped_byte_is_a_miss(store: Any, tmp_path: Path) -> None:
    assert store.set("k1", random_page(1))
    (damaged,) = page_files(tmp_path)
    data = bytearray(damaged.read_bytes())
    data[PAGE_BYTES // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    assert read_back(store, "k1") is None
    assert store.pages_rejected == 1


def test_two_pages_of_one_session_swapped_are_both_misses(store: Any, tmp_path: Path) -> None:
    first, second, _third = (page_file(store, tmp_path, key) for key in write_session(store, "s1", 3, seed=10))
    first_bytes = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(first_bytes)

    assert read_back(store, "s1-page-0") is None
    assert read_back(store, "s1-page-1") is None
    assert read_back(store, "s1-page-2") is not None
    assert store.pages_rejected == 2
    assert store.batch_exists(["s1-page-0", "s1-page-1", "s1-page-2"]) == 0


def test_pages_swapped_between_two_sessions_are_misses(store: Any, tmp_path: Path) -> None:
    mine = write_session(store, "alice", 4, seed=20)
    theirs = write_session(store, "bob", 4, seed=30)
    for key_a, key_b in zip(mine, theirs, strict=True):
        path_a, path_b = page_file(store, tmp_path, key_a), page_file(store, tmp_path, key_b)
        bytes_a = path_a.read_bytes()
        path_a.write_bytes(path_b.read_bytes())
        path_b.write_bytes(bytes_a)

    assert all(read_back(store, key) is None for key in mine + theirs)
    assert store.pages_rejected == 8


def test_unchecked_sglang_file_pool_serves_a_swapped_page_as_kv(cpu_compat: bool, tmp_path: Path) -> None:
    """What the verification is for: SGLang's own backend hands another page's bytes back without a word."""
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    plain = HiCacheFile(storage_config(tmp_path))
    assert plain.set("k1", random_page(1))
    assert plain.set("k2", random_page(2))
    path_1, path_2 = (tmp_path / f"{plain._get_suffixed_key(key)}.bin" for key in ("k1", "k2"))
    path_1.write_bytes(path_2.read_bytes())
    assert torch.equal(read_back(plain, "k1"), random_page(2))


@pytest.mark.parametrize("keep", [0, PAGE_BYTES // 2, PAGE_BYTES, PAGE_BYTES + 8])
def test_a_truncated_page_is_a_miss(store: Any, tmp_path: Path, keep: int) -> None:
    assert store.set("k1", random_page(1))
    (damaged,) = page_files(tmp_path)
    with damaged.open("r+b") as handle:
        handle.truncate(keep)
    assert read_back(store, "k1") is None
    assert store.pages_rejected == 1


def test_a_page_with_bytes_after_its_trailer_is_a_miss(store: Any, tmp_path: Path) -> None:
    assert store.set("k1", random_page(1))
    (damaged,) = page_files(tmp_path)
    with damaged.open("ab") as handle:
        handle.write(b"\0")
    assert read_back(store, "k1") is None


def test_a_write_that_fails_midway_leaves_no_page(store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages are written to a temporary file renamed into place: until the rename there is no page."""

    def crash(source: str, destination: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    assert not store.set("k1", random_page(1))
    monkeypatch.undo()
    assert not store.exists("k1")
    assert list(tmp_path.iterdir()) == []
    assert read_back(store, "k1") is None
    assert store.pages_rejected == 0


def test_a_page_is_logged_once_however_often_it_fails(cpu_compat: bool, caplog: pytest.LogCaptureFixture) -> None:
    from sessiongate.sglang_ext.internals.page_digest import Rejections

    rejections = Rejections(logging.getLogger("test.pool"))
    with caplog.at_level(logging.WARNING, logger="test.pool"):
        for _ in range(3):
            rejections.note("page-a", "digest mismatch")
        rejections.note("page-b", "digest mismatch")
    assert rejections.count == 4
    assert [record.args[0] for record in caplog.records if record.args] == ["page-a", "page-b"]


def test_a_page_in_one_buffer_or_in_parts_has_one_digest_and_each_key_its_own() -> None:
    # The file pool hashes a page in one call, the Mooncake pool its K and V parts in one stream: the same bytes
    # under the same key give the same trailer either way, and under another key another one.
    from sessiongate.sglang_ext.internals.page_digest import pack_trailer, problem

    page = memoryview(os.urandom(PAGE_BYTES))
    halves = [page[: PAGE_BYTES // 2], page[PAGE_BYTES // 2 :]]
    trailer = pack_trailer("k1", [page])
    assert pack_trailer("k1", halves) == trailer
    assert problem("k1", halves, trailer) is None
    assert pack_trailer("k2", [page]) != trailer
    assert problem("k2", [page], trailer) == "digest mismatch"


def test_unchecked_crc32_xxh3_and_verified_pages_never_mix(cpu_compat: bool, tmp_path: Path) -> None:
    import dataclasses

    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from sessiongate.sglang_ext.internals.checked_file_store import CheckedFileStore
    from sessiongate.sglang_ext.internals.page_digest import MODEL_TAG

    checked = CheckedFileStore(storage_config(tmp_path))
    plain = HiCacheFile(storage_config(tmp_path))
    # Pages of the earlier formats: the CRC-32 trailer, then the xxh3 digest of the key and the page in one stream.
    earlier = [
        HiCacheFile(dataclasses.replace(storage_config(tmp_path), model_name=f"tiny-{tag}"))
        for tag in ("crc32", "xxh3")
    ]
    assert checked.set("k1", random_page(1))
    assert plain.set("k2", random_page(2))
    for i, store in enumerate(earlier, start=3):
        assert store.set(f"k{i}", random_page(i))
    assert not plain.exists("k1")
    assert not checked.exists("k2")
    assert not checked.exists("k3")
    assert not checked.exists("k4")
    assert MODEL_TAG == "xxh3s"
    assert f"-{MODEL_TAG}_" in checked._get_suffixed_key("k1")


@pytest.mark.parametrize(
    ("pool", "expected"),
    [(FILE_BACKEND, "CheckedFileStore"), (UNCHECKED_FILE_BACKEND, "HiCacheFile")],
)
def test_the_launcher_loads_both_file_pools_through_sglangs_dynamic_backend(
    cpu_compat: bool, tmp_path: Path, pool: str, expected: str
) -> None:
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from sessiongate.sglang_ext.internals.plugin_ops import _pool_name

    command = build_command(WorkerConfig(state_dir=tmp_path, device="cpu", storage_backend=pool))
    backend = command[command.index("--hicache-storage-backend") + 1]
    extra_json = command[command.index("--hicache-storage-backend-extra-config") + 1]
    extra = json.loads(extra_json)
    assert backend == "dynamic"
    assert extra["file_storage_path"] == str(tmp_path / "kv-pool")
    # The worker reports the pool by the name it was configured with.
    assert _pool_name(backend, extra_json) == pool

    config = storage_config(tmp_path)
    config.extra_config = extra
    store = StorageBackendFactory.create_backend(backend, config, mem_pool_host=None)
    assert type(store).__name__ == expected
    assert store.file_path == str(tmp_path / "kv-pool")


def test_the_default_pool_is_the_verified_one() -> None:
    assert WorkerConfig().storage_backend == FILE_BACKEND


def test_the_cost_benchmark_compares_the_unchecked_and_the_verified_pool(
    cpu_compat: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    from sessiongate.benchmarks import pool_checksum_bench

    assert pool_checksum_bench.main(["--page-kib", "4", "--pages", "4", "--repeats", "1"]) == 0
    rows = [line.split("|")[2].strip() for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == ["file-unchecked", "file", "digest alone (xxh3-64)"]


def test_the_worker_report_gives_the_verified_prefetchs_overhead() -> None:
    import argparse
    from datetime import UTC, datetime

    from sessiongate.benchmarks.pool_checksum_worker import Sample, _report

    def sample(backend: str, repeat: int, seconds: float) -> Sample:
        return Sample(backend, 1024, repeat, 16, 16 << 16, seconds, seconds + 0.01, seconds / 2, seconds / 4)

    samples = [
        sample("file-unchecked", 0, 0.010),
        sample("file", 0, 0.011),
        sample("file-unchecked", 1, 0.020),
        sample("file", 1, 0.021),
        sample("file-unchecked", 2, 0.012),
        sample("file", 2, 0.0132),
    ]
    args = argparse.Namespace(model_size="tiny", contexts=[1024], repeats=3)
    report = _report(args, samples, 0, {"file": 0}, 64 << 10, 10.0, datetime.now(UTC), (1.0, 1, 1), (1.0, 1, 1))
    rows = {line.split("|")[3].strip(): line.split("|") for line in report.splitlines() if line.startswith("| 1024")}
    unchecked, verified = rows["file-unchecked"], rows["file"]
    assert [cell.strip() for cell in unchecked[4:8]] == ["12.0 (10.0-20.0)", "0.09", "6.0", "3.0"]
    # Medians 13.2 over 12.0 ms, the best 11 over 10; each repeat's pair +10%, +5%, +10%; CPU times the same shares.
    assert [cell.strip() for cell in verified[8:11]] == [
        "+10.0% / +10.0% / +10.0%",
        "+10.0% / +10.0%",
        "+10.0% / +10.0%",
    ]
    # 16 pages of 10 us over the unchecked 12 ms wall, 6 ms CPU, 3 ms pool threads' CPU.
    assert verified[11].strip() == "1.3% / 2.7% / 5.3%"
