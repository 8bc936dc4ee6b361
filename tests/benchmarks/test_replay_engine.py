"""A short replay against the real CPU stack the harness starts: two tiny SGLang workers and the gateway."""

from __future__ import annotations

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
            load = LoadReport.model_validate(httpx.get(f"{url}{LOAD_PATH}", timeout=30).json())
            assert (load.device_kv_tokens_used, load.host_kv_tokens_used) == (0, 0)
        records = anyio.run(run, stack.url, model_dir(cluster.state_dir, "tiny") / "tokenizer.json")
        stats = stack.advisory_stats()

    assert len(records) == 6
    assert all(r.error is None for r in records), [r.error for r in records]
    for r in records:
        assert r.output_tokens == 8  # ignore_eos: the trace's length, not the random model's
        expected = next(s for s in sessions if s.id == r.session_id).prompt_tokens(r.turn)
        assert abs(r.prompt_tokens - expected) <= 0.1 * expected  # synthetic text follows the trace's counts
        if r.turn > 0:
            assert r.cached_device + r.cached_host + r.cached_pool > 0
    assert stats is not None
    assert stats["requests"] == 4
