"""The fake worker held to the real one: the same cases against two fakes and two real SGLang CPU workers.

`benchmarks.fake_worker` stands in for SGLang in the gateway's tests and benchmarks; what it reports about the
cache (`cached_tokens` and the `cached_tokens_details` the gateway reads: device / host / storage) must be what a
real worker reports, or those tests prove things about a worker that does not exist. Each case runs on a pair of
workers, A and B, that share a KV pool and nothing else, configured alike: page 64, a device pool of 4096 tokens,
a host tier twice that, SGLang's default storage threshold (256 tokens). The fake pair is served on real sockets;
the real pair is the tiny model (tokens differ: the fake counts words, so each case states what it needs in each
worker's own counts and checks that its prompts meet it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig
from sessiongate.sglang_ext.ports import pick_port
from sessiongate.sglang_ext.protocol import LOAD_PATH, LoadReport
from tests.conftest import running_workers

from .conftest import chat, long_system_prompt

PAGE = 64
DEVICE_TOKENS = 4096  # the tiny model's device pool (`WorkerConfig.effective_max_total_tokens`)
STORAGE_THRESHOLD = 256  # SGLang's `prefetch_threshold` (HiCache storage extra config) by default
READY_TIMEOUT = 300.0


@dataclass
class Pair:
    """Two workers sharing a pool: `pool_size()` grows as pages reach it."""

    a: httpx.Client
    b: httpx.Client
    pool_size: Callable[[], int]

    def wait_written(self, before: int, timeout: float = 60.0) -> None:
        """Until what was computed since `pool_size()` was `before` is in the pool (written in the background,
        page after page: until the pool stops growing)."""
        deadline = time.monotonic() + timeout
        while self.pool_size() <= before:
            assert time.monotonic() < deadline, "nothing reached the pool"
            time.sleep(0.05)
        size = self.pool_size()
        while True:
            time.sleep(0.5)
            if self.pool_size() == size or time.monotonic() > deadline:
                return
            size = self.pool_size()


@dataclass(frozen=True)
class Tiers:
    prompt: int
    cached: int
    device: int
    host: int
    storage: int


def tiers(answer: dict[str, Any]) -> Tiers:
    """What the gateway reads of a response: its cached tokens and where they came from (SGLang sends no details
    when nothing was cached)."""
    usage = answer["usage"]
    details = (answer.get("sglext") or {}).get("cached_tokens_details") or {}
    return Tiers(
        prompt=int(usage["prompt_tokens"]),
        cached=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
        device=int(details.get("device", 0)),
        host=int(details.get("host", 0)),
        storage=int(details.get("storage", 0)),
    )


def reusable(prompt_tokens: int) -> int:
    """The most a hit can cover: all but the prompt's last token, in whole pages."""
    return (prompt_tokens - 1) // PAGE * PAGE


def system(tag: str, facts: int, question: str = "Which page?") -> list[dict[str, Any]]:
    return [{"role": "system", "content": long_system_prompt(tag, facts)}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def fake_pair() -> Iterator[Pair]:
    pool: list[tuple[str, ...]] = []

    def behaviour() -> FakeWorkerBehaviour:
        return FakeWorkerBehaviour(
            model="tiny",
            page_size=PAGE,
            device_kv_tokens_total=DEVICE_TOKENS,
            host_kv_tokens_total=2 * DEVICE_TOKENS,
            pool=pool,
            pool_write_delay_s=0.05,
        )

    with _served(create_fake_worker(behaviour())) as a, _served(create_fake_worker(behaviour())) as b:
        yield Pair(a, b, lambda: len(pool))


@pytest.fixture(scope="module")
def real_pair(worker_state_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    pool_dir = tmp_path_factory.mktemp("contract-pool")
    configs = [
        WorkerConfig(
            state_dir=worker_state_dir,
            port=pick_port(),
            pool_dir=pool_dir,
            log_file=worker_state_dir / f"contract-{name}.log",
            cpu_threads=cores_per_worker(2),
            gpu_share=2,
        )
        for name in ("a", "b")
    ]
    with (
        running_workers(*configs, timeout_s=READY_TIMEOUT) as (first, second),
        httpx.Client(base_url=first.url, timeout=120.0) as a,
        httpx.Client(base_url=second.url, timeout=120.0) as b,
    ):
        yield Pair(a, b, lambda: sum(1 for _ in pool_dir.iterdir()))


@pytest.fixture(scope="module", params=["fake", pytest.param("real", marks=pytest.mark.engine)])
def pair(request: pytest.FixtureRequest) -> Pair:
    fixture: Pair = request.getfixturevalue(f"{request.param}_pair")
    return fixture


@contextlib.contextmanager
def _served(app: Any) -> Iterator[httpx.Client]:
    """`app` behind a real uvicorn server on 127.0.0.1, in a thread; a client for it."""
    port = pick_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "the fake worker did not start"
        assert time.monotonic() < deadline, "the fake worker did not start in time"
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_second_turn_finds_the_first_on_the_device(pair: Pair) -> None:
    turn1 = system("second-turn", 12)
    first = tiers(chat(pair.a, turn1))
    assert first.cached == 0
    assert first.prompt > PAGE
    reply = chat(pair.a, turn1)["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And page 28?"}]
    second = tiers(chat(pair.a, turn2))
    # All of turn 1's prompt, from the device alone: nothing had left it, so neither host nor pool is read.
    assert second.device == second.cached
    assert second.cached >= reusable(first.prompt)
    assert second.cached < second.prompt
    assert (second.host, second.storage) == (0, 0)


def test_the_same_prompt_again_reuses_all_but_its_last_token(pair: Pair) -> None:
    messages = system("again", 8)
    first = tiers(chat(pair.a, messages))
    again = tiers(chat(pair.a, messages))
    assert first.cached == 0
    assert (again.device, again.host, again.storage) == (reusable(first.prompt), 0, 0)


def test_a_prefix_under_the_storage_threshold_is_no_storage_hit(pair: Pair) -> None:
    messages = system("short", 5, "?")
    before = pair.pool_size()
    computed = tiers(chat(pair.a, messages))
    # At least a page of it is in the pool, and less than SGLang's storage threshold.
    assert PAGE <= reusable(computed.prompt) < STORAGE_THRESHOLD
    pair.wait_written(before)
    elsewhere = tiers(chat(pair.b, messages))
    assert elsewhere.cached == 0  # B has none of it on its device, and the pool is not read for so little


def test_a_prefix_over_the_storage_threshold_comes_from_the_pool_on_another_worker(pair: Pair) -> None:
    messages = system("long", 40)
    before = pair.pool_size()
    a_before, b_before = _load(pair.a).pool_calls, _load(pair.b).pool_calls
    computed = tiers(chat(pair.a, messages))
    assert reusable(computed.prompt) >= STORAGE_THRESHOLD
    pair.wait_written(before)
    elsewhere = tiers(chat(pair.b, messages))
    # A's device is A's own: B finds the prompt in the pool only.
    assert (elsewhere.device, elsewhere.host) == (0, 0)
    assert elsewhere.storage == elsewhere.cached == reusable(computed.prompt)
    # Both timed their calls to the pool (the load report's `pool_calls`): A's write-through of the prompt's pages,
    # B's lookup of them and its read.
    a_after, b_after = _load(pair.a).pool_calls, _load(pair.b).pool_calls
    assert a_after["write"].pages - a_before["write"].pages >= reusable(computed.prompt) // PAGE
    assert a_after["write"].seconds > a_before["write"].seconds
    assert b_after["lookup"].calls > b_before["lookup"].calls
    read = b_after["read"]
    assert read.calls > b_before["read"].calls
    assert read.pages - b_before["read"].pages >= elsewhere.storage // PAGE
    assert read.seconds > b_before["read"].seconds
    assert read.recent_ms is not None
    assert read.recent_ms > 0


def _load(client: httpx.Client) -> LoadReport:
    response = client.get(LOAD_PATH)
    assert response.status_code == 200, response.text
    return LoadReport.model_validate(response.json())


def test_a_full_device_evicts_the_least_recently_used_prompt_to_host(pair: Pair) -> None:
    session = system("evict-session", 20)
    computed = tiers(chat(pair.a, session))
    assert computed.cached == 0
    total = _load(pair.a).device_kv_tokens_total
    assert total == DEVICE_TOKENS
    # Other prompts, more than the device holds in all: the session's pages are the oldest.
    filled, n = 0, 0
    while filled <= total:
        filler = tiers(chat(pair.a, system(f"evict-filler-{n}", 40)))
        assert filler.cached == 0
        filled, n = filled + filler.prompt, n + 1
    back = tiers(chat(pair.a, session))
    # It left the device, not the worker: written through to host memory, it comes back from there.
    assert back.device < reusable(computed.prompt)
    assert back.host > 0
    assert back.device + back.host + back.storage == back.cached == reusable(computed.prompt)


def test_another_cache_salt_finds_nothing(pair: Pair) -> None:
    messages = system("salted", 20)
    before = pair.pool_size()
    first = tiers(chat(pair.a, messages, cache_salt="tenant-a"))
    assert first.cached == 0
    assert tiers(chat(pair.a, messages, cache_salt="tenant-a")).device == reusable(first.prompt)
    # The same prompt under another salt, or none: no hit on the device, in host memory, or in the pool.
    assert tiers(chat(pair.a, messages, cache_salt="tenant-b")).cached == 0
    assert tiers(chat(pair.a, messages)).cached == 0
    pair.wait_written(before)
    assert tiers(chat(pair.b, messages, cache_salt="tenant-c")).cached == 0
    # The pool does hold it, for its own salt.
    assert tiers(chat(pair.b, messages, cache_salt="tenant-a")).storage == reusable(first.prompt)
