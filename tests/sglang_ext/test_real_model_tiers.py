"""Cross-tier correctness on a real model: KV served from any tier gives the tokens a recompute gives.

SmolLM2-135M-Instruct on real SGLang 0.5.23 CPU workers, greedy decoding. One turn (a prompt of ~500
tokens, 24 new tokens with `ignore_eos`, so the comparison is never cut short) is first computed with no cache
anywhere; then the same turn is served

- from the device cache (the same worker again);
- from the host tier (the device copy evicted by memory pressure, the write-through copy in host memory kept);
- from the shared pool: the `file` pool (the worker's cache flushed, device and host) and Mooncake Store
  (a second worker that never saw the turn);
- after an advisory prefetch: the extension's prefetch endpoint, called with the turn's messages as the
  gateway's advisor calls it, on a worker that never saw the turn (to the device from either pool; to host
  memory from the file pool);
- from a damaged file pool: a session's pages written by one worker, overwritten with random bytes of the same
  size, must be misses on the worker that serves the session's next turn (the default pool verifies every page:
  sessiongate/sglang_ext/internals/checked_file_store.py), which then gives a recompute's answer;

and each time the output token ids must equal the recomputed ones, and so must the log-probability of each
(equal tokens alone missed a corrupted copy of one layer's keys, see `LOGPROB_TOLERANCE`). SGLang's cache report
(`cached_tokens_details`) must show that every case was served from the tier it claims, with all whole pages
of the prompt reused: a case that silently recomputed would prove nothing.

Each test starts and stops its own two workers (at most two SmolLM2 workers run at once).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.mooncake import MasterConfig, MooncakeMaster, mooncake_unavailable, start_master
from sessiongate.sglang_ext.protocol import LOAD_PATH, LoadReport
from sessiongate.sglang_ext.worker_process import stop_all

from .conftest import prefetch, wait_finished

pytestmark = pytest.mark.engine

READY_TIMEOUT = 300.0
PAGE = 64  # WorkerConfig.page_size
NEW_TOKENS = 24
# A's device pool: 16 pages, so the pressure turn (~11 pages) cannot fit beside the turn under test (8 pages).
SMALL_DEVICE_TOKENS = 1024
# Greedy tokens alone are a coarse check: with the keys of one layer (of 30) shifted by one position within
# each page on the host -> device copy, the 24 tokens stayed the same while their log-probabilities moved by up
# to 0.88. Served from any tier here, they equal the recompute's exactly (a gap of 0); the tolerance only allows
# for float32 rounding in a different order of operations.
LOGPROB_TOLERANCE = 1e-4


def _messages(tag: str, facts: int) -> list[dict[str, str]]:
    """A real question over a system prompt of `facts` lines; `tag` comes first, so prompts share no page."""
    colours = ("red", "blue", "green", "white", "yellow")
    lines = [f"Lighthouse {i} of the {tag} coast was painted {colours[i % 5]} in {1890 + 3 * i}." for i in range(facts)]
    return [
        {"role": "system", "content": f"{tag}: you answer questions about lighthouses.\n" + "\n".join(lines)},
        {"role": "user", "content": "Which colour was lighthouse 12 painted, and in which year?"},
    ]


TURN = _messages("Atlantic", 24)


def serve(client: httpx.Client, messages: list[dict[str, str]], **fields: Any) -> dict[str, Any]:
    """The turn through SGLang's OpenAI chat endpoint, greedy, with its output token ids and cache report."""
    body = {
        **fields,
        "model": "smollm2",
        "messages": messages,
        "temperature": 0,
        "max_tokens": NEW_TOKENS,
        "ignore_eos": True,
        "return_token_ids": True,
        "return_cached_tokens_details": True,
        "logprobs": True,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    choice = result["choices"][0]
    assert len(choice["response_token_ids"]) == NEW_TOKENS, choice
    return result


def output_ids(result: dict[str, Any]) -> list[int]:
    ids: list[int] = result["choices"][0]["response_token_ids"]
    return ids


def logprobs(result: dict[str, Any]) -> list[float]:
    return [float(entry["logprob"]) for entry in result["choices"][0]["logprobs"]["content"]]


def assert_same_answer(served: dict[str, Any], recomputed: dict[str, Any]) -> None:
    """The same greedy tokens, each chosen with the same log-probability (to float32 rounding)."""
    assert output_ids(served) == output_ids(recomputed)
    gap = max(abs(a - b) for a, b in zip(logprobs(served), logprobs(recomputed), strict=True))
    assert gap <= LOGPROB_TOLERANCE, f"the same tokens, but log-probabilities differ by up to {gap:.3g}"


def tiers(result: dict[str, Any]) -> dict[str, int]:
    """Where the prompt's cached tokens came from; all zero when nothing was cached (SGLang then omits it)."""
    details = result.get("sglext", {}).get("cached_tokens_details") or {}
    reported = {tier: int(details.get(tier, 0)) for tier in ("device", "host", "storage")}
    assert sum(reported.values()) == int((result["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return reported


def whole_pages(result: dict[str, Any]) -> int:
    """Tokens of the prompt's whole pages that a request can reuse (never its last token)."""
    return (int(result["usage"]["prompt_tokens"]) - 1) // PAGE * PAGE


def flush(client: httpx.Client) -> None:
    """Empty the worker's device and host tiers (SGLang's `/flush_cache` resets both)."""
    response = client.post("/flush_cache", params={"timeout": 60})
    assert response.status_code == 200, response.text


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)


def _config(model_dir: Path, state_dir: Path, port: int, name: str, **fields: Any) -> WorkerConfig:
    return WorkerConfig(
        model_path=model_dir,
        state_dir=state_dir,
        port=port,
        log_file=state_dir / f"{name}.log",
        cpu_threads=cores_per_worker(2),
        gpu_share=2,
        **fields,
    )


@contextlib.contextmanager
def running(*configs: WorkerConfig) -> Iterator[list[httpx.Client]]:
    """Start the workers together (their start-ups overlap), yield a client for each, stop them all."""
    processes: list[WorkerProcess] = []
    try:
        for config in configs:
            processes.append(start_worker(config))
        for process in processes:
            process.wait_ready(READY_TIMEOUT)
        with contextlib.ExitStack() as stack:
            yield [stack.enter_context(httpx.Client(base_url=p.url, timeout=300.0)) for p in processes]
    finally:
        stop_all(processes)


def test_every_tier_of_the_file_pool_gives_the_recomputed_tokens(
    smollm2_model_dir: Path, tmp_path: Path, free_ports: Callable[[], int]
) -> None:
    pool = tmp_path / "kv-pool"
    a_config = _config(
        smollm2_model_dir, tmp_path, free_ports(), "tiers-a", pool_dir=pool, max_total_tokens=SMALL_DEVICE_TOKENS
    )
    b_config = _config(smollm2_model_dir, tmp_path, free_ports(), "tiers-b", pool_dir=pool, max_total_tokens=2048)
    with running(a_config, b_config) as (a, b):
        recomputed = serve(a, TURN)
        assert tiers(recomputed) == {"device": 0, "host": 0, "storage": 0}
        reusable = whole_pages(recomputed)
        assert reusable >= 6 * PAGE

        # (a) the device cache.
        on_device = serve(a, TURN)
        assert tiers(on_device) == {"device": reusable, "host": 0, "storage": 0}
        assert_same_answer(on_device, recomputed)

        # (b) the host tier: the turn's pages are written through to host memory (and on to the pool); a longer
        # turn then needs more pages than the device has free, and LRU eviction takes this turn's device copy.
        wait_until(lambda: len(list(pool.iterdir())) >= reusable // PAGE, "the turn's pages reached the pool")
        pressure = serve(a, _messages("Pacific", 36))
        assert whole_pages(pressure) + reusable > SMALL_DEVICE_TOKENS
        from_host = serve(a, TURN)
        assert tiers(from_host) == {"device": 0, "host": reusable, "storage": 0}
        assert_same_answer(from_host, recomputed)

        # (c) the file pool: nothing left in this worker's memory.
        flush(a)
        from_pool = serve(a, TURN)
        assert tiers(from_pool) == {"device": 0, "host": 0, "storage": reusable}
        assert_same_answer(from_pool, recomputed)

        # (d) an advisory prefetch on a worker that never saw the turn: the pages come from the pool before the
        # request does, so the request finds them all on the device.
        accepted = prefetch(b, session_id="tiers", messages=TURN, target="device")
        assert accepted.tokens == recomputed["usage"]["prompt_tokens"]  # the worker rendered the same prompt
        status = wait_finished(b, accepted.prefetch_id)
        assert (status.state, status.pages_unavailable) == ("done", 0)
        assert status.pages_on_device == reusable // PAGE
        prefetched = serve(b, TURN)
        assert tiers(prefetched) == {"device": reusable, "host": 0, "storage": 0}
        assert_same_answer(prefetched, recomputed)

        # ... and one that stops at host memory (the advisor's `host` target), B's memory emptied first.
        flush(b)
        to_host = wait_finished(b, prefetch(b, session_id="tiers-host", messages=TURN, target="host").prefetch_id)
        assert (to_host.state, to_host.pages_unavailable, to_host.pages_in_host) == ("done", 0, reusable // PAGE)
        prefetched_to_host = serve(b, TURN)
        assert tiers(prefetched_to_host) == {"device": 0, "host": reusable, "storage": 0}
        assert_same_answer(prefetched_to_host, recomputed)

        # (e) a damaged pool: A serves another session's turn, whose pages reach the pool; every one of them is
        # then overwritten with random bytes of the same size (SGLang's own `file` backend would serve them as KV).
        # The session's next turn goes to B, which never saw it: all misses, and a recompute's answer.
        first_turn = _messages("Baltic", 24)
        before = set(pool.glob("*.bin"))
        first = serve(a, first_turn)
        wait_until(
            lambda: len(set(pool.glob("*.bin")) - before) >= whole_pages(first) // PAGE, "the pages reached the pool"
        )
        for page_file in set(pool.glob("*.bin")) - before:
            page_file.write_bytes(os.urandom(page_file.stat().st_size))
        next_turn = [
            *first_turn,
            {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And which colour was lighthouse 7 painted?"},
        ]
        # The reference: the same turn computed from nothing (a salt of its own shares no page with anything).
        reference = serve(a, next_turn, cache_salt="recompute")
        assert tiers(reference) == {"device": 0, "host": 0, "storage": 0}
        on_b = serve(b, next_turn)
        assert tiers(on_b) == {"device": 0, "host": 0, "storage": 0}
        assert_same_answer(on_b, reference)
        load = LoadReport.model_validate(b.get(LOAD_PATH).json())
        assert load.pool_pages_rejected > 0


def _require_mooncake() -> None:
    unavailable = mooncake_unavailable()
    if unavailable is None:
        return
    why = f"the Mooncake Store client does not import here ({unavailable}); scripts/setup.sh installs it"
    if os.environ.get("SESSIONGATE_REQUIRE_MOONCAKE") == "1":
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


@pytest.fixture
def mooncake_master(tmp_path: Path, free_ports: Callable[[], int]) -> Iterator[MooncakeMaster]:
    _require_mooncake()
    config = MasterConfig(
        rpc_port=free_ports(),
        metadata_port=free_ports(),
        admin_port=free_ports(),
        log_file=tmp_path / "mooncake-master.log",
    )
    with start_master(config) as master:
        master.wait_ready()
        yield master


def test_the_mooncake_pool_and_a_prefetch_from_it_give_the_recomputed_tokens(
    smollm2_model_dir: Path, tmp_path: Path, free_ports: Callable[[], int], mooncake_master: MooncakeMaster
) -> None:
    configs = [
        mooncake_master.config.pool_of(
            _config(
                smollm2_model_dir, tmp_path, free_ports(), name, max_total_tokens=2048, mooncake_segment_bytes=256 << 20
            )
        )
        for name in ("mooncake-a", "mooncake-b")
    ]
    with running(*configs) as (a, b):
        keys_before = set(mooncake_master.keys())
        recomputed = serve(a, TURN)
        assert tiers(recomputed) == {"device": 0, "host": 0, "storage": 0}
        reusable = whole_pages(recomputed)
        # SGLang's Mooncake store keeps a page's K and V as two objects.
        wait_until(
            lambda: len(set(mooncake_master.keys()) - keys_before) >= 2 * reusable // PAGE,
            "the turn's pages reached the Mooncake pool",
        )

        # (c) Mooncake: B has nothing of the turn in memory.
        from_pool = serve(b, TURN)
        assert from_pool["sglext"]["cached_tokens_details"]["storage_backend"] == "GuardedMooncakeStore"
        assert tiers(from_pool) == {"device": 0, "host": 0, "storage": reusable}
        assert_same_answer(from_pool, recomputed)

        # (d) an advisory prefetch from Mooncake, B's memory emptied first.
        flush(b)
        accepted = prefetch(b, session_id="tiers-mooncake", messages=TURN, target="device")
        status = wait_finished(b, accepted.prefetch_id)
        assert (status.state, status.pages_unavailable, status.pages_on_device) == ("done", 0, reusable // PAGE)
        prefetched = serve(b, TURN)
        assert tiers(prefetched) == {"device": reusable, "host": 0, "storage": 0}
        assert_same_answer(prefetched, recomputed)
