"""The systems the simulator compares: each a routing policy and what of sessiongate it has (host tier, shared
pool, advisories, the tool-call KV lifecycle, priority-based KV memory, the oracle's hints)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SYSTEMS", "SystemSpec"]


@dataclass(frozen=True, slots=True)
class SystemSpec:
    name: str
    policy: str
    host_tier: bool
    pool: bool
    advisories: bool
    # The advisor's tool-call KV lifecycle (sessiongate/gateway/advisor/toolkv.py) in place of the clients' tool hints.
    tool_kv: bool = False
    # Views without the token figures (`active_prefill_tokens`, `active_kv_tokens`): what the gateway's load
    # reports give its policies today (request counts only).
    counts_only: bool = False
    # Priority-based KV memory: a live advisory's prefetch ranks above unhinted KV until the advisory expires and
    # may evict it to make room (False: the old rule, a prefetch takes free memory only and ranks as any KV).
    ranked_prefetch: bool = True
    # The hints of a client that knows the future: every turn after the first, none false, at the ideal lead
    # (`oracle_lead_s`), always to the device (no hint-quality gate). The ceiling of what any hint can gain.
    oracle: bool = False
    # Typing hints timed (`advisory_typing_timed`: fired the load time before the turn the gateway expects from the
    # gaps it learnt) or at once; None: the gateway's default.
    typing_timed: bool | None = None
    # Each hint is told its turn's exact arrival (the client's hints, at the client's times, with the oracle's
    # knowledge of when): what timing alone is worth, beside the oracle's placement and retention.
    hints_know_arrival: bool = False


SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec("recompute", "round_robin", host_tier=False, pool=False, advisories=False),
        SystemSpec("sticky", "sticky", host_tier=True, pool=False, advisories=False),
        SystemSpec("cache_aware", "cache_aware", host_tier=True, pool=True, advisories=False),
        SystemSpec("kv_aware", "kv_aware", host_tier=True, pool=True, advisories=False),
        SystemSpec("kv_aware+advisories", "kv_aware", host_tier=True, pool=True, advisories=True),
        SystemSpec("kv_aware+oracle", "kv_aware", host_tier=True, pool=True, advisories=True, oracle=True),
        SystemSpec(
            "kv_aware+advisories-timed", "kv_aware", host_tier=True, pool=True, advisories=True, typing_timed=True
        ),
        SystemSpec(
            "kv_aware+advisories-free-only",
            "kv_aware",
            host_tier=True,
            pool=True,
            advisories=True,
            ranked_prefetch=False,
        ),
        SystemSpec("dynamo_cost", "dynamo_cost", host_tier=True, pool=True, advisories=False),
        SystemSpec("dynamo_cost+oracle", "dynamo_cost", host_tier=True, pool=True, advisories=True, oracle=True),
        SystemSpec("dynamo_cost+advisories", "dynamo_cost", host_tier=True, pool=True, advisories=True),
        SystemSpec(
            "dynamo_cost+advisories-timed", "dynamo_cost", host_tier=True, pool=True, advisories=True, typing_timed=True
        ),
        SystemSpec(
            "dynamo_cost+advisories-exact",
            "dynamo_cost",
            host_tier=True,
            pool=True,
            advisories=True,
            hints_know_arrival=True,
        ),
        SystemSpec("dynamo_cost+toolkv", "dynamo_cost", host_tier=True, pool=True, advisories=True, tool_kv=True),
        SystemSpec("kv_aware+toolkv", "kv_aware", host_tier=True, pool=True, advisories=True, tool_kv=True),
        SystemSpec(
            "kv_aware+toolkv-counts",
            "kv_aware",
            host_tier=True,
            pool=True,
            advisories=True,
            tool_kv=True,
            counts_only=True,
        ),
    )
}
