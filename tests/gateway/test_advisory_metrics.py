"""The advisor's figures on `/metrics`: signals by kind, prefetches sent, outcomes, bytes moved by prefetch and
prefetch latency, driven through the real app against fake workers that speak the extension (the prefetch
brings what the shared pool holds and reports 1024 bytes per token), read back as Prometheus text."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Gateway
from .test_signals import FAST, USER, _settled, _turn, eventually

pytestmark = pytest.mark.anyio


async def _samples(gw: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await gw.client.get("/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_advisory_metrics(make_gateway: Any) -> None:
    # The typing hint must outlive its prefetch and the follow-up turn on a loaded CI machine (at 0.5 s it once
    # expired first, so the turn found no hint to use); the explicit one then takes 2 s to expire as wasted.
    async with make_gateway(**{**FAST, "advisory_ttl_s": 2.0}) as gw:
        before = await _samples(gw)
        assert before[("sessiongate_prefetches_sent_total", (("target", "device"),))] == 0
        assert before[("sessiongate_prefetch_seconds_count", ())] == 0

        # A typing hint whose prefetch the next turn uses.
        first = await _turn(gw, "used", [USER])
        assert (await gw.client.post("/v1/sessions/used/typing", json={"state": "started"})).status_code == 202

        async def prefetched() -> bool:
            return any(p["state"] == "done" for w in gw.workers.values() for p in w.prefetches.values())

        await eventually(prefetched)
        await asyncio.sleep(0.1)  # the advisor's poll sees it done
        follow_up = [USER, first["choices"][0]["message"], {"role": "user", "content": "and the museums"}]
        await _turn(gw, "used", follow_up)
        # An explicit hint nobody follows (it expires: wasted), and a follow-up turn no hint foresaw (missed).
        await _turn(gw, "idle", [USER])
        assert (await gw.client.post("/v1/sessions/idle/advise", json={"kind": "explicit"})).status_code == 202
        await _settled(gw, "idle")
        second = await _turn(gw, "unforeseen", [USER])
        await _turn(gw, "unforeseen", [USER, second["choices"][0]["message"], {"role": "user", "content": "more"}])
        await gw.state.advisor.flush_missed()

        after = await _samples(gw)
        assert after[("sessiongate_advisory_signals_total", (("kind", "typing"),))] == 1
        assert after[("sessiongate_advisory_signals_total", (("kind", "explicit"),))] == 1
        assert after[("sessiongate_advisory_outcomes_total", (("kind", "typing"), ("outcome", "used")))] == 1
        assert after[("sessiongate_advisory_outcomes_total", (("kind", "explicit"), ("outcome", "wasted")))] == 1
        assert after[("sessiongate_advisory_outcomes_total", (("kind", "none"), ("outcome", "missed")))] == 1
        sent = after[("sessiongate_prefetches_sent_total", (("target", "device"),))]
        assert sent == 2
        done = after[("sessiongate_prefetch_seconds_count", ())]
        assert done == 2
        assert after[("sessiongate_prefetch_seconds_bucket", (("le", "+Inf"),))] == done
        assert 0 < after[("sessiongate_prefetch_seconds_sum", ())] < 5
        brought = sum(p.get("available", 0) for w in gw.workers.values() for p in w.prefetches.values())
        assert brought > 0
        assert after[("sessiongate_prefetch_bytes_total", ())] == brought * 1024


async def test_the_workers_prefetch_evictions_by_rank(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        worker_name, worker = next(iter(gw.workers.items()))
        worker.prefetch_evicted_tokens = {"unhinted": 640, "expired_hint": 128}

        async def reported() -> bool:
            samples = await _samples(gw)
            return any(name == "sessiongate_worker_prefetch_evicted_tokens" for name, _ in samples)

        await eventually(reported)
        after = await _samples(gw)
        evicted = {
            dict(labels)["rank"]: value
            for (name, labels), value in after.items()
            if name == "sessiongate_worker_prefetch_evicted_tokens"
        }
        assert evicted == {"unhinted": 640, "expired_hint": 128}
        assert all(
            dict(labels)["worker"] == gw.ids[worker_name]
            for (name, labels), _ in after.items()
            if name == "sessiongate_worker_prefetch_evicted_tokens"
        )
