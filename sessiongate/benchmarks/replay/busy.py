"""The busy-worker scenario: one worker kept busy by long generations sent straight to it, while a multi-turn
replay goes through the gateway. Compares kv_aware with advisories against sticky and round_robin.

The same two workers (HiCache and the shared pool, as for kv_aware) serve the three policies one after another;
only the gateway is restarted. Every policy replays the same sessions, with text of its own (the synthetic text is
seeded by the system's name), so no policy finds another's prefixes.
The background load starts before the replay and stops after it, so every turn of every policy sees it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
from pathlib import Path
from typing import Any

import anyio
import httpx

from sessiongate.benchmarks.metrics import RunSummary, summarize, write_records
from sessiongate.benchmarks.workloads import SessionTrace
from sessiongate.sglang_ext.models import MODELS

from .common import (
    LABEL,
    advisory_counts,
    cluster_config,
    estimated_bytes,
    hint_model,
    in_window,
    load_sessions,
    model_name,
    run_notes,
    save,
    synthetic_text,
    work_dir,
)
from .driver import ReplayOptions, ReplayResult, replay
from .systems import ADMIN_KEY, SYSTEMS, SystemSpec, start_front, start_workers, warm_up

__all__ = ["BUSY_POLICIES", "run_busy_worker"]

BUSY_POLICIES = (
    SystemSpec("round_robin", "sessiongate", "round_robin", True, True, False),
    SystemSpec("sticky", "sessiongate", "sticky", True, True, False),
    SYSTEMS["kv_aware+advisories"],
)
_BUSY_PROMPT_WORDS = 200


async def _keep_busy(url: str, model: str, text: Any, done: list[int], streams: int, output_tokens: int) -> None:
    rng = random.Random(7)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one_stream() -> None:
            while True:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": text.message(_BUSY_PROMPT_WORDS, rng)}],
                    "max_tokens": output_tokens,
                    "ignore_eos": True,
                }
                with contextlib.suppress(httpx.HTTPError):
                    await client.post("/v1/chat/completions", json=body)
                    done[0] += 1

        async with anyio.create_task_group() as group:
            for _ in range(streams):
                group.start_soon(one_stream)


async def _replay_with_busy_worker(
    gateway_url: str, busy_url: str, spec: SystemSpec, load: int, args: argparse.Namespace, sessions: list[SessionTrace]
) -> tuple[ReplayResult, int]:
    background_done = [0]
    async with httpx.AsyncClient(base_url=gateway_url, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        model = await model_name(client)
        options = ReplayOptions(
            system=spec.name,
            concurrency=load,
            time_scale=args.time_scale,
            hints=hint_model(args) if spec.hints else None,
            max_duration_s=args.duration_s,
            model=model,
            text=synthetic_text(args),
            seed=args.seed,
            progress=not args.no_progress,
        )
        async with anyio.create_task_group() as group:
            group.start_soon(
                _keep_busy, busy_url, model, options.text, background_done, args.busy_streams, args.busy_output_tokens
            )
            await anyio.sleep(3.0)  # let the busy worker's queue fill and its load report show it
            result = await replay(client, sessions, options)
            group.cancel_scope.cancel()
    return result, background_done[0]


def run_busy_worker(args: argparse.Namespace, out: Path) -> int:
    load = max(int(x) for x in args.loads.split(","))
    cluster = cluster_config(args)
    run_dir = work_dir(args, out)
    summaries: list[RunSummary] = []
    notes = [
        f"Busy-worker scenario: worker 1 of {args.workers} also serves {args.busy_streams} concurrent background "
        f"generations of {args.busy_output_tokens} tokens sent straight to it (not through the gateway), from 3 s "
        "before each replay to its end.",
        "The same workers serve the three policies one after another (the same sessions, with text of their own "
        "per policy; caches flushed after each policy's warm-up); only the gateway is restarted.",
        *run_notes(args)[:3],
        f"Command: sessiongate bench replay {' '.join(args.argv)}",
    ]
    # The same sessions for every policy (their text differs).
    sessions = load_sessions(args, args.sessions_per_slot * load, seed=args.seed * 1000 + load)
    workers = start_workers(SYSTEMS["kv_aware"], cluster, run_dir)
    try:
        busy_url = workers[0].url
        for spec in BUSY_POLICIES:
            front = start_front(spec, cluster, [w.url for w in workers], run_dir)
            url: str = getattr(front, "url")  # noqa: B009
            try:
                warm_up(url, [w.url for w in workers], MODELS[cluster.model_size].shape.vocab_size)
                stats_url = f"{url}/v1/admin/advisories/stats"

                def stats(stats_url: str = stats_url) -> dict[str, Any]:
                    response = httpx.get(stats_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
                    result: dict[str, Any] = response.json()
                    return result

                before = advisory_counts(stats())
                result, background = anyio.run(
                    functools.partial(_replay_with_busy_worker, url, busy_url, spec, load, args, sessions)
                )
                after = advisory_counts(stats())
            finally:
                front.stop()
            advisories = {k: after[k] - before.get(k, 0) for k in after}
            if spec.hints:
                advisories["hints sent"] = sum(result.hints_sent.values())
            counted = in_window(result, sessions, args)
            on_busy = sum(1 for r in counted if r.worker == busy_url.split("//")[-1])
            summary = summarize(
                spec.name,
                load,
                "sessions",
                counted,
                bytes_moved=estimated_bytes(counted, args.model_size),
                advisories=advisories,
                label=LABEL + ", one worker busy",
            )
            summary.extra.update({"turns on busy worker": on_busy, "background generations": background})
            write_records(out / "records" / f"busy-{spec.name.replace('+', '-')}-{load}.jsonl", result.records)
            summaries.append(summary)
            print(
                f"{spec.name}: TTFT mean {summary.ttft.mean * 1000:.0f} ms p99 {summary.ttft.p99 * 1000:.0f} ms, "
                f"{on_busy}/{summary.requests} turns on the busy worker, {summary.errors} errors",
                flush=True,
            )
            save(out, f"Busy worker: {args.workload} on {args.workers} CPU workers", summaries, notes, args)
    finally:
        for worker in workers:
            worker.stop()
    return 0
