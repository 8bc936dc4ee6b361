"""The verified Mooncake pool in-process: a real `mooncake_master` on loopback and `GuardedMooncakeStore`.

Pages go in and out through SGLang's zero-copy calls (`batch_set` / `get` / `batch_get` with registered buffers,
the same `_put/_get_batch_zero_copy_impl` that the workers' `batch_set_v1` / `batch_get_v1` end in); each page is
two objects, K and V, as SGLang stores them. Objects are then damaged through the store's own client (as another
writer would) and every damaged one must read as not found, be counted, and be gone from the pool. Workers on
the verified Mooncake pool are tested in test_mooncake_pool.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessiongate.sglang_ext.mooncake import MasterConfig, start_master

from .conftest import require_mooncake

require_mooncake()

HALF_PAGE = 64 * 256  # the K (or V) half of a page of 64 tokens
PAGES = 8


class Pages:
    """`PAGES` pages of host memory registered with the store; page i's K and V halves side by side."""

    def __init__(self, store: Any) -> None:
        import torch

        self.store = store
        self.buffer = torch.zeros(PAGES * 2 * HALF_PAGE, dtype=torch.uint8)
        store.register_buffer(self.buffer)

    def fill(self, seed: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.buffer.copy_(torch.randint(0, 256, self.buffer.shape, generator=generator, dtype=torch.uint8))

    def halves(self, page: int) -> list[tuple[int, int]]:
        start = int(self.buffer.data_ptr()) + page * 2 * HALF_PAGE
        return [(start, HALF_PAGE), (start + HALF_PAGE, HALF_PAGE)]

    def write(self, session: str, pages: int = PAGES) -> list[str]:
        keys, pointers, sizes = [], [], []
        for page in range(pages):
            for (pointer, size), half in zip(self.halves(page), "kv", strict=True):
                keys.append(object_key(session, page, half))
                pointers.append(pointer)
                sizes.append(size)
        assert self.store.batch_set(keys, target_locations=pointers, target_sizes=sizes)
        return keys

    def read(self, session: str, page: int) -> bool:
        """Both halves of `page` into their places; whether the page was found."""
        return all(
            self.store.get(object_key(session, page, half), target_location=pointer, target_sizes=size)
            for (pointer, size), half in zip(self.halves(page), "kv", strict=True)
        )


def object_key(session: str, page: int, half: str) -> str:
    return f"{session}-page{page}_0_{half}"


@pytest.fixture(scope="module")
def master(worker_state_dir: Path, free_ports: Callable[[], int]) -> Iterator[MasterConfig]:
    config = MasterConfig(
        rpc_port=free_ports(),
        metadata_port=free_ports(),
        admin_port=free_ports(),
        log_file=worker_state_dir / "verify-master.log",
    )
    with start_master(config) as running:
        running.wait_ready()
        yield config


@pytest.fixture(scope="module")
def store(cpu_compat: bool, master: MasterConfig) -> Any:
    from sessiongate.sglang_ext.internals.guarded_mooncake_store import GuardedMooncakeStore
    from sessiongate.sglang_ext.internals.storage_config import single_rank_storage_config

    config = single_rank_storage_config(
        "verify",
        {
            "master_server_address": master.master_address,
            "metadata_server": master.metadata_server,
            "global_segment_size": 64 << 20,
            "protocol": "tcp",
            "local_hostname": "127.0.0.1",
        },
    )
    return GuardedMooncakeStore(config)


@pytest.fixture(scope="module")
def pages(store: Any) -> Pages:
    # One buffer for the module: Mooncake refuses to register memory that overlaps a registration (a buffer
    # freed and allocated again at the same address).
    return Pages(store)


def overwrite(store: Any, key: str, value: bytes) -> None:
    assert store.store.upsert(key, value) == 0


def test_pages_round_trip_with_their_trailers(store: Any, pages: Pages) -> None:
    import torch

    from sessiongate.sglang_ext.internals.page_digest import TRAILER

    pages.fill(1)
    written = pages.buffer.clone()
    keys = pages.write("round")
    assert store.store.get_size(keys[0]) == HALF_PAGE + TRAILER.size
    rejected = store.pages_rejected
    pages.buffer.zero_()
    assert all(pages.read("round", page) for page in range(PAGES))
    assert torch.equal(pages.buffer, written)
    assert store.pages_rejected == rejected


def test_an_object_overwritten_with_other_bytes_of_the_same_size_is_a_miss(store: Any, pages: Pages) -> None:
    pages.fill(2)
    keys = pages.write("overwrite", pages=2)
    rejected = store.pages_rejected
    overwrite(store, keys[0], os.urandom(store.store.get_size(keys[0])))

    assert not pages.read("overwrite", 0)
    assert pages.read("overwrite", 1)
    assert store.pages_rejected == rejected + 1
    # Removed, so the next write-through puts it back (SGLang writes the objects that are not there).
    assert store.store.is_exist(keys[0]) == 0
    assert store.batch_exists(["overwrite-page0"]) == 0
    pages.write("overwrite", pages=2)
    assert pages.read("overwrite", 0)


@pytest.mark.parametrize("keep", [0, HALF_PAGE // 2, HALF_PAGE, HALF_PAGE + 8])
def test_a_truncated_object_is_a_miss(store: Any, pages: Pages, keep: int) -> None:
    session = f"truncated-{keep}"
    pages.fill(3)
    keys = pages.write(session, pages=1)
    rejected = store.pages_rejected
    stored = store.store.get(keys[1])
    overwrite(store, keys[1], stored[:keep] if keep else b"\0")

    assert not pages.read(session, 0)
    assert store.pages_rejected == rejected + 1
    assert store.store.is_exist(keys[1]) == 0


def test_two_pages_of_one_session_swapped_are_misses(store: Any, pages: Pages) -> None:
    pages.fill(4)
    pages.write("swap", pages=3)
    rejected = store.pages_rejected
    first, second = object_key("swap", 0, "k"), object_key("swap", 1, "k")
    first_bytes, second_bytes = store.store.get(first), store.store.get(second)
    overwrite(store, first, second_bytes)
    overwrite(store, second, first_bytes)

    assert [pages.read("swap", page) for page in range(3)] == [False, False, True]
    assert store.pages_rejected == rejected + 2


def test_pages_swapped_between_two_sessions_are_misses(store: Any, pages: Pages) -> None:
    pages.fill(5)
    alice = pages.write("alice", pages=4)
    pages.fill(6)
    bob = pages.write("bob", pages=4)
    rejected = store.pages_rejected
    for key_a, key_b in zip(alice, bob, strict=True):
        bytes_a, bytes_b = store.store.get(key_a), store.store.get(key_b)
        overwrite(store, key_a, bytes_b)
        overwrite(store, key_b, bytes_a)

    # Through the batch call SGLang's prefetch uses: not one page of either session is found.
    pointers = [pointer for page in range(4) for pointer, _ in pages.halves(page)]
    sizes = [size for page in range(4) for _, size in pages.halves(page)]
    assert store.batch_get(alice, pointers, sizes) == 0
    assert store.batch_get(bob, pointers, sizes) == 0
    assert store.pages_rejected == rejected + 16
    assert not any(store.store.is_exist(key) == 1 for key in alice + bob)


def test_an_object_of_sglangs_own_format_is_a_miss(store: Any, pages: Pages) -> None:
    """An object without a trailer (SGLang's `mooncake` backend, or an older sessiongate) is never read as KV."""
    pages.fill(7)
    key = object_key("plain", 0, "k")
    assert store.store.put(key, os.urandom(HALF_PAGE)) == 0
    (pointer, size), _ = pages.halves(0)
    rejected = store.pages_rejected
    assert not store.get(key, target_location=pointer, target_sizes=size)
    assert store.pages_rejected == rejected + 1
    assert store.store.is_exist(key) == 0


def test_the_model_name_in_the_keys_is_tagged(store: Any) -> None:
    assert store.config_prefix.endswith("-xxh3s")
