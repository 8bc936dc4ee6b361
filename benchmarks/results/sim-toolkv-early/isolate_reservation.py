"""Why kv_aware+toolkv is slower than kv_aware in mean TTFT with recorded tools and the 2 s result gap (16 workers):
the same sessions with the results posted and signalled (as in the runs), posted but not signalled, sent inline
(the same gaps, the result inside the request), and with `AdvisorBook.reservation` turned off, against kv_aware.

    PYTHONPATH=. SESSIONGATE_TRACES=... python benchmarks/results/sim-toolkv-early/isolate_reservation.py
"""

from __future__ import annotations

import dataclasses

from sessiongate.benchmarks.sim import h100_llama8b, simulate
from sessiongate.benchmarks.sim.agent_long import ResultGap, closed_loop_users, long_agent_sessions
from sessiongate.benchmarks.sim.toolkv import TOOL_NAME, SimToolKV
from sessiongate.gateway.advisor.core import AdvisorBook


def run(system: str, agents: int, variant: str) -> None:
    pool = long_agent_sessions(count=agents * 2, seed=0, tool_scale=1.0, result_gap=ResultGap(0.2, 1.8))
    if variant == "inline":
        pool = [
            dataclasses.replace(s, turns=tuple(dataclasses.replace(t, result_gap_s=None) for t in s.turns))
            for s in pool
        ]
    sessions, follow_ups = closed_loop_users(pool, agents, seed=0, think_time_s=20.0)
    tool_result, reservation = SimToolKV.tool_result, AdvisorBook.reservation
    if variant == "not signalled":

        def record_only(self: SimToolKV, session_id: str, tenant_id: str, seconds: float) -> str:
            self.lifecycle.durations.record(tenant_id, TOOL_NAME, seconds)
            return "none"

        SimToolKV.tool_result = record_only  # type: ignore[method-assign]
    if variant == "no reservation":
        AdvisorBook.reservation = lambda self, session_id, now: None  # type: ignore[method-assign]
    try:
        result = simulate(system, sessions, h100_llama8b(), workers=16, follow_ups=follow_ups)
    finally:
        SimToolKV.tool_result, AdvisorBook.reservation = tool_result, reservation  # type: ignore[method-assign]
    ttfts = [r.ttft_s for r in result.records if r.ttft_s is not None]
    prompt = sum(r.prompt_tokens for r in result.records)
    device = sum(r.cached_device for r in result.records) / prompt
    print(f"{agents} agents, {system}, {variant}: TTFT mean {sum(ttfts) / len(ttfts):.3f} s, prompt on device {device:.0%}")


for agents in (64, 128):
    run("kv_aware", agents, "results posted")
    for variant in ("results posted", "not signalled", "inline", "no reservation"):
        run("kv_aware+toolkv", agents, variant)
