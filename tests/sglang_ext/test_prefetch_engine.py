"""Advisory prefetch and the load report on real SGLang 0.5.23 servers (tiny model, CPU).

Two workers, A and B, share one `file` KV pool directory (and nothing else) for the whole module;
both are stopped at the end; both run with priority eviction (`WorkerConfig.priority_eviction`).
A session's turn 1 runs on A; B is asked to prefetch the session's context before turn 2 arrives,
and turn 2 on B must then find the prefix in its own memory. Under memory pressure B evicts the
lowest request priority first, and a prefetch nobody used before a session's KV of the same
priority. Sessions' KV is retained and dropped through HTTP on B.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.internals.no_keep import SETTLE_S
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.protocol import (
    NO_KEEP_RID_PREFIX,
    PREFETCH_PATH,
    SESSIONS_PATH,
    ErrorResponse,
    LoadReport,
    PrefetchAccepted,
    PrefetchStatus,
)
from sessiongate.sglang_ext.worker_process import stop_all

from .conftest import (
    cached,
    chat,
    kv_op,
    load_report,
    long_system_prompt,
    prefetch,
    question,
    wait_finished,
    wait_for_pool_growth,
    wait_for_pool_quiet,
)

pytestmark = pytest.mark.engine

READY_TIMEOUT = 300.0
PAGE = 64


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-kv-pool")


def _start(state_dir: Path, pool_dir: Path, port: int, name: str) -> WorkerProcess:
    config = WorkerConfig(
        state_dir=state_dir,
        port=port,
        pool_dir=pool_dir,
        priority_eviction=True,
        log_file=state_dir / f"{name}.log",
        cpu_threads=cores_per_worker(2),
        gpu_share=2,
    )
    return start_worker(config)


@pytest.fixture(scope="module")
def worker_processes(
    worker_state_dir: Path, pool_dir: Path, free_ports: Callable[[], int]
) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    # Started together, so their ~20 s start-ups overlap; at most these two run during the module.
    first = _start(worker_state_dir, pool_dir, free_ports(), "prefetch-a")
    second = _start(worker_state_dir, pool_dir, free_ports(), "prefetch-b")
    try:
        first.wait_ready(READY_TIMEOUT)
        second.wait_ready(READY_TIMEOUT)
        yield first, second
    finally:
        stop_all([first, second])


@pytest.fixture(scope="module")
def workers(worker_processes: tuple[WorkerProcess, WorkerProcess]) -> tuple[str, str]:
    return worker_processes[0].url, worker_processes[1].url


@pytest.fixture(scope="module")
def worker_a(workers: tuple[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=workers[0], timeout=120.0) as client:
        yield client


@pytest.fixture(scope="module")
def worker_b(workers: tuple[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=workers[1], timeout=120.0) as client:
        yield client


def test_idle_load_report(worker_b: httpx.Client) -> None:
    report = load_report(worker_b)
    # The speeds measured on the server's own warm-up request hold while the worker idles.
    assert report.prefill_tokens_per_s > 0
    time.sleep(2.5)  # longer than the meters' window
    assert load_report(worker_b).prefill_tokens_per_s == report.prefill_tokens_per_s
    assert report.running_requests == 0
    assert report.queued_requests == 0
    assert report.queued_prefill_tokens == 0
    assert report.device_kv_tokens_total == 4096  # WorkerConfig.max_total_tokens
    assert 0 <= report.device_kv_tokens_used <= report.device_kv_tokens_total
    assert report.host_kv_tokens_total is not None
    assert report.host_kv_tokens_total >= 2 * report.device_kv_tokens_total  # hicache_ratio 2
    assert report.host_kv_tokens_used is not None
    assert 0 <= report.host_kv_tokens_used <= report.host_kv_tokens_total
    assert report.prefetches_in_flight == 0
    assert report.page_size == PAGE
    assert abs(report.at - time.time()) < 5


def _group_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of `pid`'s process group (a worker's)."""
    group, ticks, total = os.getpgid(pid), os.sysconf("SC_CLK_TCK"), 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == group:  # pgrp; utime and stime are the 12th and 13th fields after the name
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def test_an_idle_worker_does_not_spin(worker_processes: tuple[WorkerProcess, WorkerProcess]) -> None:
    # Without --sleep-on-idle SGLang's scheduler loop spins a core while it has nothing to run (idle_wait.py).
    pid = worker_processes[0].pid
    before = _group_cpu_s(pid)
    time.sleep(3)
    used = _group_cpu_s(pid) - before
    assert used < 0.75, f"an idle worker used {used:.2f} s of CPU in 3 s"


def test_prefetch_moves_a_session_to_another_worker(
    worker_a: httpx.Client, worker_b: httpx.Client, pool_dir: Path
) -> None:
    turn1 = [{"role": "system", "content": long_system_prompt("move")}, {"role": "user", "content": "Page 21?"}]
    files_before = len(list(pool_dir.iterdir()))
    answer1 = chat(worker_a, turn1)
    wait_for_pool_growth(pool_dir, files_before)
    context = [*turn1, {"role": "assistant", "content": answer1["choices"][0]["message"]["content"]}]
    turn2 = [*context, {"role": "user", "content": "And page 28?"}]

    accepted = prefetch(worker_b, session_id="move", messages=context, target="device")
    assert accepted.session_id == "move"
    assert accepted.tokens > 30 * PAGE
    status = wait_finished(worker_b, accepted.prefetch_id)
    assert status.state == "done"
    full_pages = accepted.tokens // PAGE
    assert status.pages_requested == full_pages  # B had nothing of it
    assert status.pages_on_device + status.pages_in_host == full_pages
    assert status.pages_on_device > 0  # B's device pool was free
    assert status.pages_unavailable == 0
    assert status.bytes_loaded > 0
    assert status.finished_at is not None

    on_b = chat(worker_b, turn2)
    on_a = chat(worker_a, turn2)
    details = on_b["sglext"]["cached_tokens_details"]
    assert details["storage"] == 0  # nothing left to fetch from the pool at request time
    assert details["device"] + details["host"] == on_b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert details["device"] + details["host"] >= full_pages * PAGE
    assert details["device"] >= status.pages_on_device * PAGE
    # The same KV, so the same greedy answer as the worker that computed it.
    assert on_b["choices"][0]["message"]["content"] == on_a["choices"][0]["message"]["content"]


def test_a_prefetch_waits_for_pages_still_on_their_way_to_the_pool(
    worker_a: httpx.Client, worker_b: httpx.Client
) -> None:
    # A hint the instant a turn ends elsewhere: that turn's pages are still on their way to the pool (A's
    # write-through runs in the background). Made deterministic here: B is asked first, A computes the context
    # after, and B, told to wait for the pool, reads every page once they are there, none before.
    ids = _ids(31, 24)
    waiting = prefetch(worker_b, session_id="right-after", input_ids=ids, target="host", await_pool_ms=20_000)
    time.sleep(0.5)
    assert worker_b.get(f"{PREFETCH_PATH}/{waiting.prefetch_id}").json()["state"] == "running"
    _generate_greedy(worker_a, ids)
    status = wait_finished(worker_b, waiting.prefetch_id, timeout=30.0)
    assert status.state == "done"
    assert status.pages_unavailable == 0
    assert status.pages_in_host + status.pages_on_device == 24
    assert _generate_greedy(worker_b, ids)["meta_info"]["cached_tokens_details"]["storage"] == 0
    # Without the wait, a context whose pages are not in the pool yet is a miss at once.
    other = prefetch(worker_b, session_id="no-wait", input_ids=_ids(32, 24), target="host")
    assert wait_finished(worker_b, other.prefetch_id).pages_unavailable == 24


def test_prefetch_by_token_ids_to_host(worker_a: httpx.Client, worker_b: httpx.Client, pool_dir: Path) -> None:
    prompt = [7 + i % 400 for i in range(12 * PAGE + 5)]  # the tiny vocabulary has 512 ids
    files_before = len(list(pool_dir.iterdir()))
    generated = worker_a.post("/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}})
    assert generated.status_code == 200, generated.text
    wait_for_pool_growth(pool_dir, files_before)

    accepted = prefetch(worker_b, session_id="ids", input_ids=prompt, target="host")
    assert accepted.tokens == len(prompt)
    status = wait_finished(worker_b, accepted.prefetch_id)
    assert status.state == "done"
    assert status.target == "host"
    assert status.pages_on_device == 0  # host was asked for, nothing more
    assert status.pages_in_host == 12
    assert status.pages_unavailable == 0

    again = worker_b.post(
        "/generate",
        json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}, "return_cached_tokens_details": True},
    )
    assert again.status_code == 200, again.text
    details = again.json()["meta_info"]["cached_tokens_details"]
    assert details["host"] == 12 * PAGE
    assert details["storage"] == 0


def test_prefetch_of_unknown_content_is_a_miss(worker_b: httpx.Client) -> None:
    messages = [{"role": "system", "content": long_system_prompt("never-seen", 30)}, {"role": "user", "content": "?"}]
    accepted = prefetch(worker_b, session_id="unknown", messages=messages)
    status = wait_finished(worker_b, accepted.prefetch_id)
    assert status.state == "done"
    assert status.pages_unavailable == accepted.tokens // PAGE
    assert status.pages_on_device == status.pages_in_host == 0
    assert status.bytes_loaded == 0
    assert chat(worker_b, messages)["usage"]["completion_tokens"] > 0  # nothing broke


def test_corrupt_pool_pages_are_a_miss(worker_a: httpx.Client, worker_b: httpx.Client, pool_dir: Path) -> None:
    messages = [{"role": "system", "content": long_system_prompt("corrupt")}, {"role": "user", "content": "Hi"}]
    before = set(pool_dir.iterdir())
    computed = chat(worker_a, messages)
    wait_for_pool_growth(pool_dir, len(before))
    for page_file in set(pool_dir.iterdir()) - before:
        with page_file.open("r+b") as handle:
            handle.truncate(page_file.stat().st_size // 2)

    accepted = prefetch(worker_b, session_id="corrupt", messages=messages)
    status = wait_finished(worker_b, accepted.prefetch_id)
    assert status.state == "done"
    assert status.pages_unavailable == accepted.tokens // PAGE
    assert status.pages_on_device == status.pages_in_host == 0
    # B recomputes: a miss, and the right answer.
    served = chat(worker_b, messages)
    assert served["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert served["choices"][0]["message"]["content"] == computed["choices"][0]["message"]["content"]


def test_cancel(worker_b: httpx.Client) -> None:
    accepted = prefetch(worker_b, session_id="cancel", input_ids=[3 + i % 300 for i in range(8 * PAGE)])
    cancelled = worker_b.delete(f"{PREFETCH_PATH}/{accepted.prefetch_id}")
    assert cancelled.status_code == 200, cancelled.text
    status = PrefetchStatus.model_validate(cancelled.json())
    # Nothing of it is in the pool, so it may have finished before the DELETE arrived.
    assert status.state in ("cancelled", "done")
    assert status.finished_at is not None
    again = worker_b.get(f"{PREFETCH_PATH}/{accepted.prefetch_id}")
    assert PrefetchStatus.model_validate(again.json()).state == status.state
    assert load_report(worker_b).prefetches_in_flight == 0


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_unknown_prefetch_id_is_404(worker_b: httpx.Client, method: str) -> None:
    response = worker_b.request(method, f"{PREFETCH_PATH}/no-such-prefetch")
    assert response.status_code == 404
    assert ErrorResponse.model_validate(response.json()).error.code == "not_found"


USER = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"session_id": "s"}, "invalid_body"),
        ({"session_id": "s", "messages": USER, "input_ids": [1, 2]}, "invalid_body"),
        ({"session_id": "s", "messages": []}, "invalid_body"),
        ({"session_id": "s", "input_ids": []}, "invalid_body"),
        ({"messages": USER}, "invalid_body"),
        ({"session_id": "s", "messages": USER, "target": "disk"}, "invalid_body"),
        ({"session_id": "s", "messages": USER, "model": "another-model"}, "wrong_model"),
        ({"session_id": "s", "input_ids": [5] * 200_000}, "context_too_long"),
        ({"session_id": "s", "messages": [{"role": "robot", "content": "x"}]}, "invalid_messages"),
        ({"session_id": "s", "input_ids": [1, 2, 100_000]}, "invalid_token_ids"),
    ],
    ids=[
        "neither",
        "both",
        "empty-messages",
        "empty-ids",
        "no-session",
        "bad-target",
        "model",
        "oversized",
        "role",
        "out-of-vocabulary",
    ],
)
def test_bad_prefetch_requests_are_refused(worker_b: httpx.Client, body: dict[str, Any], code: str) -> None:
    response = worker_b.post(PREFETCH_PATH, json=body)
    assert response.status_code == 400, response.text
    error = ErrorResponse.model_validate(response.json()).error
    assert error.code == code
    assert error.type == "invalid_request_error"
    assert error.message


def test_prefetch_body_that_is_not_json_is_refused(worker_b: httpx.Client) -> None:
    response = worker_b.post(PREFETCH_PATH, content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert ErrorResponse.model_validate(response.json()).error.code == "invalid_body"


def test_load_report_during_a_long_generation(worker_a: httpx.Client) -> None:
    # Deterministic on a loaded machine: the generation is streamed, so its first chunk says it decodes; reports
    # are then polled, with no pause, until they have shown it running and decoding or it ends. It is long enough
    # not to end first (a fixed 400 tokens once did, on CI, before any report came), and aborted once seen.
    rid = f"load-report-{time.monotonic_ns()}"
    decoding, done = threading.Event(), threading.Event()
    chunks: list[dict[str, Any]] = []
    status: list[int] = []

    def generate() -> None:
        body = {
            "rid": rid,
            "text": "tick " * 40,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
            "stream": True,
        }
        try:
            with worker_a.stream("POST", "/generate", json=body, timeout=300.0) as response:
                status.append(response.status_code)
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(orjson.loads(line[len("data: ") :]))
                        decoding.set()
        finally:
            decoding.set()
            done.set()

    thread = threading.Thread(target=generate)
    thread.start()
    busy: list[LoadReport] = []
    try:
        assert decoding.wait(60.0), "the generation sent nothing in 60 s"
        deadline = time.monotonic() + 60.0
        while len(busy) < 3 and not done.is_set() and time.monotonic() < deadline:
            report = load_report(worker_a)
            if report.running_requests >= 1 and report.decode_tokens_per_s > 0:
                busy.append(report)
    finally:
        aborted = worker_a.post("/abort_request", json={"rid": rid})
        thread.join()
    assert aborted.status_code == 200, aborted.text
    assert status == [200]
    assert chunks, "the generation streamed nothing"
    # It was still decoding when it was stopped: every report above came while it ran.
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort", chunks[-1]["meta_info"]
    assert busy, "no report while the generation ran showed it running and decoding"
    assert all(report.device_kv_tokens_used > 0 for report in busy)


def test_load_figures_are_on_the_metrics_endpoint(worker_a: httpx.Client) -> None:
    response = worker_a.get("/metrics")
    assert response.status_code == 200
    for name in ("prefetches_in_flight", "decode_tokens_per_s", "prefill_tokens_per_s", "host_kv_tokens_total"):
        assert f"sessiongate:{name}" in response.text


def _ids(seed: int, pages: int) -> list[int]:
    """A prompt of whole pages plus one token (a request reuses at most all but its last token)."""
    return [3 + (seed * 7919 + i * 31) % 500 for i in range(pages * PAGE + 1)]


def _generate(client: httpx.Client, ids: list[int], priority: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1},
        "return_cached_tokens_details": True,
    }
    if priority is not None:
        body["priority"] = priority
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    meta: dict[str, Any] = response.json()["meta_info"]
    return meta


def test_request_priority_decides_what_leaves_the_device_first(worker_b: httpx.Client) -> None:
    # B's device pool is 64 pages; start from an empty cache so the test owns it.
    assert worker_b.post("/flush_cache", params={"timeout": 60}).status_code == 200
    session = _ids(1, 20)
    _generate(worker_b, session)  # default priority (1), and the older of the two
    one_off = _ids(2, 20)
    _generate(worker_b, one_off, priority=0)  # newer, lower priority

    # A request that needs more than the free pages: something must leave the device.
    pressure = _generate(worker_b, _ids(3, 36))
    assert pressure["completion_tokens"] == 1

    # The low-priority KV went first (LRU alone would have taken the older session's pages).
    assert _generate(worker_b, session)["cached_tokens_details"]["device"] == 20 * PAGE
    probe = prefetch(worker_b, session_id="probe", input_ids=one_off, target="host")
    assert wait_finished(worker_b, probe.prefetch_id).pages_on_device < 20


# --- session KV operations and the fate of prefetched KV -----------------------------------------


def test_drop_and_retain_through_http(worker_b: httpx.Client, pool_dir: Path) -> None:
    assert worker_b.post("/flush_cache", params={"timeout": 60}).status_code == 200
    # Both sessions fit on the device (64 pages) together: ~12 shared pages and ~11 of each.
    system = {"role": "system", "content": long_system_prompt("shared", facts=20)}
    first = [system, {"role": "user", "content": question("one")}]
    second = [system, {"role": "user", "content": question("two")}]
    files = len(list(pool_dir.iterdir()))
    chat(worker_b, first)
    shared_tokens, _ = cached(chat(worker_b, second))  # what the two prompts share, in whole pages
    assert shared_tokens >= 8 * PAGE
    wait_for_pool_growth(pool_dir, files)
    wait_for_pool_quiet(pool_dir)  # both sessions' last pages reach the pool
    first_tokens, _ = cached(chat(worker_b, first))
    second_tokens, _ = cached(chat(worker_b, second))
    assert first_tokens > shared_tokens
    assert second_tokens > shared_tokens

    retained = kv_op(worker_b, "two", "retain", messages=second, priority=5, ttl_ms=60_000)
    assert retained.operation == "retain"
    assert retained.session_id == "two"
    assert retained.device_tokens >= second_tokens
    assert retained.host_tokens >= second_tokens  # written through
    assert retained.storage_tokens >= shared_tokens

    dropped = kv_op(worker_b, "one", "drop", messages=first)
    assert dropped.operation == "drop"
    assert dropped.device_tokens >= first_tokens - shared_tokens  # its own pages, not the shared prefix
    assert dropped.storage_tokens >= first_tokens - shared_tokens

    again_tokens, again = cached(chat(worker_b, first))
    assert again_tokens == shared_tokens  # only the prefix the other session still uses
    assert again["storage"] == 0  # nothing of its own was left in the pool either
    assert cached(chat(worker_b, second))[0] == second_tokens  # the other session lost nothing


@pytest.mark.parametrize(
    ("operation", "body", "status", "code"),
    [
        ("retain", {}, 400, "invalid_body"),
        ("drop", {"messages": []}, 400, "invalid_body"),
        ("drop", {"messages": USER, "input_ids": [1, 2]}, 400, "invalid_body"),
        ("retain", {"messages": USER, "ttl_ms": 0}, 400, "invalid_body"),
        ("retain", {"messages": USER, "model": "another-model"}, 400, "wrong_model"),
        ("drop", {"input_ids": [1, 2, 100_000]}, 400, "invalid_token_ids"),
        ("drop", {"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_messages"),
        ("forget", {"messages": USER}, 404, "not_found"),
    ],
    ids=["no-context", "empty", "both", "ttl", "model", "vocabulary", "role", "operation"],
)
def test_bad_session_requests_are_refused(
    worker_b: httpx.Client, operation: str, body: dict[str, Any], status: int, code: str
) -> None:
    response = worker_b.post(f"{SESSIONS_PATH}/s/{operation}", json=body)
    assert response.status_code == status, response.text
    assert ErrorResponse.model_validate(response.json()).error.code == code


def test_dropping_a_context_nothing_holds_is_a_no_op(worker_b: httpx.Client) -> None:
    result = kv_op(worker_b, "ghost", "drop", input_ids=[9 + i % 300 for i in range(6 * PAGE)])
    assert (result.device_tokens, result.host_tokens, result.storage_tokens) == (0, 0, 0)
    assert result.tokens == 6 * PAGE


def _generate_greedy(client: httpx.Client, ids: list[int], max_new_tokens: int = 1) -> dict[str, Any]:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        "return_cached_tokens_details": True,
    }
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_a_wrong_hint_leaves_the_device_first_and_requests_still_finish(worker_b: httpx.Client, pool_dir: Path) -> None:
    # The device pool is 64 pages. The hint's context is in the pool only. Its advisory's ttl passes before the
    # pressure comes: within it, a live hint's pages rank above unhinted ones (the next test).
    hint = _ids(11, 20)
    files = len(list(pool_dir.iterdir()))
    _generate_greedy(worker_b, hint)
    wait_for_pool_growth(pool_dir, files)
    time.sleep(1.0)
    assert worker_b.post("/flush_cache", params={"timeout": 60}).status_code == 200
    running = _ids(12, 4)
    expected = _generate_greedy(worker_b, running, max_new_tokens=200)["output_ids"]
    session = _ids(13, 20)
    _generate_greedy(worker_b, session)  # default priority 1, older than the hint

    accepted: PrefetchAccepted = prefetch(worker_b, session_id="never-comes", input_ids=hint, priority=1, ttl_ms=1000)
    status = wait_finished(worker_b, accepted.prefetch_id)
    assert status.pages_on_device == 20
    time.sleep(1.2)  # the hint's ttl passes: it ranks lowest of all now

    outputs: list[dict[str, Any]] = []
    decoding = threading.Thread(target=lambda: outputs.append(_generate_greedy(worker_b, running, max_new_tokens=200)))
    decoding.start()
    time.sleep(0.5)  # the generation is decoding when the pressure arrives
    try:
        pressure = _generate_greedy(worker_b, _ids(14, 30))  # more than the free pages: something must go
    finally:
        decoding.join()
    assert pressure["meta_info"]["completion_tokens"] == 1
    assert outputs[0]["output_ids"] == expected  # the running request is unaffected

    # The unused hint went first (LRU alone would have taken the older session's pages).
    assert _generate_greedy(worker_b, session)["meta_info"]["cached_tokens_details"]["device"] == 20 * PAGE
    probe = prefetch(worker_b, session_id="probe", input_ids=hint, target="host")
    assert wait_finished(worker_b, probe.prefetch_id).pages_on_device < 20
    # Nothing was lost: what left the device is still in host memory or the pool.
    assert worker_b.get(f"{PREFETCH_PATH}/{probe.prefetch_id}").json()["pages_unavailable"] == 0


def test_a_live_hints_prefetch_evicts_idle_kv_below_it_and_never_a_running_request(
    worker_b: httpx.Client, pool_dir: Path
) -> None:
    # Priority-based KV memory: the device pool is 64 pages, the hint's context (20 pages) is in the pool only,
    # idle sessions fill the device, and a request decodes while the prefetch runs.
    hint = _ids(21, 20)
    files = len(list(pool_dir.iterdir()))
    _generate_greedy(worker_b, hint)
    wait_for_pool_growth(pool_dir, files)
    time.sleep(1.0)
    assert worker_b.post("/flush_cache", params={"timeout": 60}).status_code == 200
    running = _ids(22, 4)
    expected = _generate_greedy(worker_b, running, max_new_tokens=200)["output_ids"]
    for seed in (23, 24, 25):
        # Three idle sessions, default priority (1): 42 pages, so that with the generation's 8 the free pages hold
        # fewer than the hint's 20 whether or not the generation is still decoding when the prefetch comes.
        _generate_greedy(worker_b, _ids(seed, 14))
    before = load_report(worker_b).prefetch_evicted_tokens

    outputs: list[dict[str, Any]] = []
    decoding = threading.Thread(target=lambda: outputs.append(_generate_greedy(worker_b, running, max_new_tokens=200)))
    decoding.start()
    time.sleep(0.3)  # the generation is decoding when the prefetch comes
    try:
        accepted = prefetch(worker_b, session_id="hinted", input_ids=hint, priority=1, target="device")
        status = wait_finished(worker_b, accepted.prefetch_id)
    finally:
        decoding.join()
    assert outputs[0]["output_ids"] == expected  # the running request kept its pages and its reserve
    # The free pages, less the decoding request's reserve, hold fewer than 20 pages: idle, unhinted KV of the
    # hint's priority made the rest of the room (with free pages only, the prefetch stopped in host memory).
    assert status.pages_on_device == 20
    evicted = load_report(worker_b).prefetch_evicted_tokens
    assert evicted.get("unhinted", 0) - before.get("unhinted", 0) >= PAGE
    metrics = worker_b.get("/metrics").text
    assert 'sessiongate:prefetch_evicted_tokens{rank="unhinted"}' in metrics
    # The hinted session's next turn finds every page on the device.
    assert _generate_greedy(worker_b, hint)["meta_info"]["cached_tokens_details"]["device"] == 20 * PAGE


def test_a_no_keep_request_leaves_nothing_of_its_own(worker_b: httpx.Client, pool_dir: Path) -> None:
    assert worker_b.post("/flush_cache", params={"timeout": 60}).status_code == 200
    time.sleep(1.0)  # earlier tests' last pool writes land
    messages = [{"role": "user", "content": question("secret")}]
    files = set(pool_dir.iterdir())
    body = {
        "model": "tiny",
        "messages": messages,
        "temperature": 0,
        "max_tokens": 8,
        "rid": f"{NO_KEEP_RID_PREFIX}one-off",  # what the gateway sends for `X-Sessiongate-Keep: false`
    }
    one_off = worker_b.post("/v1/chat/completions", json=body)
    assert one_off.status_code == 200, one_off.text
    time.sleep(SETTLE_S + 2.0)  # the worker drops the request's pages once it has finished

    assert set(pool_dir.iterdir()) == files  # none of its pages was written to the pool
    again = chat(worker_b, messages)  # the same prompt, kept as usual this time
    # Nothing of it was left on the device or in host memory (SGLang omits the details when nothing is cached).
    assert (again["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
    assert again["choices"][0]["message"]["content"] == one_off.json()["choices"][0]["message"]["content"]
