"""`dynamo_cost`: Dynamo's KV-router cost on hand-built views (pure: no app, no I/O)."""

from __future__ import annotations

import pytest

from sessiongate.gateway.routing import (
    POLICY_NAMES,
    DynamoCost,
    DynamoWeights,
    KVResidency,
    RouteRequest,
    WorkerView,
    make_policy,
)
from sessiongate.gateway.settings import GatewaySettings, SettingsError


def _worker(worker_id: str, *, prefill: int = 0, kv: int = 0, running: int = 0, queued: int = 0) -> WorkerView:
    return WorkerView(
        id=worker_id,
        url=f"http://{worker_id}",
        in_flight=0,
        running=running,
        queued=queued,
        active_prefill_tokens=prefill,
        active_kv_tokens=kv,
    )


def _request(prompt: int, kv: KVResidency | None = None) -> RouteRequest:
    return RouteRequest(session_id="s", tenant_id="t", prompt_tokens=prompt, kv=kv or KVResidency())


def test_the_cost_is_prefill_blocks_minus_tier_credits_plus_decode_blocks() -> None:
    # 64-token blocks: a 6,400-token prompt is 100 blocks; 20 on a's device, 40 more in its host tier, 20 more
    # in the pool; 640 tokens queued for prefill (10 blocks) and 1,280 KV tokens decoding (20 blocks).
    kv = KVResidency(device={"a": 1280}, host={"a": 3840}, pool=5120)
    cost = DynamoCost().cost(_request(6400, kv), _worker("a", prefill=640, kv=1280))
    assert cost == pytest.approx((10 + 100 - (20 * 1.0 + 40 * 0.75 + 20 * 0.25)) + 20)


def test_credit_counts_whole_blocks_and_never_makes_prefill_negative() -> None:
    policy = DynamoCost()
    # 100 tokens on device: one whole block credited, the 36-token tail is not.
    assert policy.cost(_request(128, KVResidency(device={"a": 100})), _worker("a")) == pytest.approx(1.0)
    # More credit than prefill work: clamped at 0, the decode blocks remain.
    full = KVResidency(device={"a": 6400})
    assert policy.cost(_request(6400, full), _worker("a", kv=640)) == pytest.approx(10.0)


def test_device_hit_beats_an_equally_loaded_cold_worker_and_host_beats_pool() -> None:
    policy = DynamoCost()
    workers = [_worker("a"), _worker("b"), _worker("c")]
    assert policy.choose(_request(8192, KVResidency(device={"b": 8192})), workers).id == "b"
    # a holds it in host (credit 0.75 a block), every worker can read the pool (0.25): a wins.
    assert policy.choose(_request(8192, KVResidency(host={"a": 8192}, pool=8192)), workers).id == "a"


def test_load_outweighs_the_cache_once_it_costs_more_blocks_than_the_credit() -> None:
    policy = DynamoCost()
    kv = KVResidency(device={"a": 6400})  # 100 blocks of credit on a
    # a decodes 200 blocks of KV: 200 > b's 100 blocks of prefill, so b wins despite the cache.
    assert policy.choose(_request(6400, kv), [_worker("a", kv=12_800), _worker("b")]).id == "b"
    # a decodes 50 blocks: 50 < 100, the cache wins.
    assert policy.choose(_request(6400, kv), [_worker("a", kv=3200), _worker("b")]).id == "a"


def test_host_and_pool_weights_decide_between_a_busy_host_hit_and_an_idle_pool_read() -> None:
    kv = KVResidency(host={"a": 6400}, pool=6400)  # 100 blocks
    workers = [_worker("a", prefill=3200), _worker("b")]  # a: 50 blocks of prefill queued
    # a: 50 + 100 - 75 = 75; b: 100 - 25 = 75 -> tie at the defaults; with pool reads worth Dynamo's shared-cache
    # multiplier (0.5), b wins; with active requests weighted, a's queue tips it to b as well.
    assert DynamoCost().costs(_request(6400, kv), workers) == {"a": pytest.approx(75.0), "b": pytest.approx(75.0)}
    assert DynamoCost(DynamoWeights(pool_weight=0.5)).choose(_request(6400, kv), workers).id == "b"


def test_active_requests_count_only_with_their_weight() -> None:
    busy, idle = _worker("a", running=8), _worker("b")
    kv = KVResidency(device={"a": 640})  # 10 blocks of credit on a
    assert DynamoCost().choose(_request(640, kv), [busy, idle]).id == "a"
    weighted = DynamoCost(DynamoWeights(active_request_weight=2.0))
    assert weighted.choose(_request(640, kv), [busy, idle]).id == "b"


def test_ties_rotate_and_views_without_token_figures_fall_back_to_counts() -> None:
    policy = DynamoCost()
    idle = [_worker("a"), _worker("b")]
    assert {policy.choose(_request(640), idle).id for _ in range(4)} == {"a", "b"}
    # No token figures (the gateway's views today): 3 queued requests count as 3 typical prompts of 512 tokens.
    bare = WorkerView(id="a", url="http://a", in_flight=0, running=0, queued=3)
    assert policy.cost(_request(640), bare) == pytest.approx((3 * 512 + 640) / 64)


def test_registered_by_name_for_the_gateway_setting() -> None:
    assert "dynamo_cost" in POLICY_NAMES
    assert isinstance(make_policy("dynamo_cost"), DynamoCost)
    env = {"SESSIONGATE_ROUTING_POLICY": "dynamo_cost"}
    assert GatewaySettings.from_env(env).routing_policy == "dynamo_cost"
    with pytest.raises(SettingsError):
        GatewaySettings.from_env({"SESSIONGATE_ROUTING_POLICY": "dynamo"})


def test_kv_aware_waits_by_the_prompt_tokens_ahead_when_a_view_counts_them() -> None:
    from sessiongate.gateway.routing import CostModel

    cost = CostModel(typical_prefill_tokens=512, default_prefill_tokens_per_s=10_000.0)
    # One queued request either way; a's is a 60k-token tool output, b's a short one. Counted as "typical"
    # requests the two wait alike; with the tokens known, a waits 6 s, and b the count's floor (512 tokens), since
    # a short prompt queued behind a full batch waits for more than its own tokens.
    a = _worker("a", prefill=60_000, queued=1)
    b = _worker("b", prefill=300, queued=1)
    assert cost.wait_s(a) == pytest.approx(6.0, rel=1e-3)
    assert cost.wait_s(b) == pytest.approx(0.0512, rel=1e-3)
    blind = [WorkerView(id=w.id, url=w.url, in_flight=0, running=0, queued=1) for w in (a, b)]
    assert cost.wait_s(blind[0]) == cost.wait_s(blind[1])
