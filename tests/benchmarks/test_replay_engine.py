"""A short replay against the real CPU stack the harness starts: two tiny SGLang workers and the gateway."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import httpx
import pytest

from sessiongate.benchmarks.metrics import TurnRecord
from sessiongate.benchmarks.replay.driver import ReplayOptions, replay
from sessiongate.benchmarks.replay.systems import SYSTEMS, ClusterConfig, running_stack
from sessiongate.benchmarks.replay.text import SyntheticText
from sessiongate.benchmarks.workloads import HintModel, SessionTrace, Turn
from sessiongate.sglang_ext.models import model_dir
from sessiongate.sglang_ext.protocol import LOAD_PATH, LoadReport

pytestmark = pytest.mark.engine


def test_replay_on_real_workers_reuses_the_cache(tmp_path: Path) -> None:
    sessions = [
        SessionTrace(
            f"engine-{n}",
            "synthetic",
            0.0,
            (Turn(300, 8, 0.0, "first"), Turn(40, 8, 0.5, "user"), Turn(30, 8, 0.5, "user")),
        )
        for n in range(2)
    ]
    cluster = ClusterConfig(state_dir=tmp_path / "state", max_total_tokens=2048)
    spec = SYSTEMS["kv_aware+advisories"]

    async def run(url: str, tokenizer: Path) -> list[TurnRecord]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            options = ReplayOptions(
                system=spec.name,
                concurrency=2,
                hints=HintModel(lead_s=0.2),
                model=model,
                text=SyntheticText.for_tokenizer(tokenizer),
                progress=False,
            )
            return (await replay(client, sessions, options)).records

    with running_stack(spec, cluster, tmp_path / "run") as stack:
        # The warm-up's requests are flushed: every system starts with nothing cached on device or host.
        for url in stack.worker_urls:
            load = _load_between_requests(url)
            assert (load.device_kv_tokens_used, load.host_kv_tokens_used) == (0, 0)
        records = anyio.run(run, stack.url, model_dir(cluster.state_dir, "tiny") / "tokenizer.json")
        stats = stack.advisory_stats()

    assert len(records) == 6
    assert all(r.error is None for r in records), [r.error for r in records]
    for r in records:
        assert r.output_tokens == 8  # ignore_eos: the trace's length, not the random model's
        expected = next(s for s in sessions if s.id == r.session_id).prompt_tokens(r.turn)
        assert abs(r.prompt_tokens - expected) <= 0.1 * expected  # synthetic text follows the trace's counts
        cached = r.cached_device + r.cached_host + r.cached_pool
        if r.turn > 0:
            assert cached > 0
        else:  # sessions share no page of text, and the warm-up's pages are gone or under keys no text makes
            assert cached == 0, r
    assert stats is not None
    assert stats["requests"] == 4


def _load_between_requests(url: str) -> LoadReport:
    """The worker's load report once no request holds device KV (or the last one, after 5 s).

    The gateway checks each worker's `/health` every 2 s, and SGLang answers it by generating one token: that
    request holds a page of device KV while it runs, and the snapshot SGLang publishes as its prefill ends still
    counts the page (`device_kv_tokens_used` counts held pages, not cached ones). A page held for 5 s by a worker
    with nothing to do would be a leak, and the assertion on the report returned fails on it.
    """
    for _ in range(50):
        load = LoadReport.model_validate(httpx.get(f"{url}{LOAD_PATH}", timeout=30).json())
        if load.device_kv_tokens_used == 0:
            break
        time.sleep(0.1)
    return load
