"""`KVBelief`'s capacity rule: a session's KV is believed where a worker's LRU tiers would still hold it."""

from __future__ import annotations

import time

import httpx

from sessiongate.gateway.routing import KVAware, KVBelief, KVResidency, RouteRequest, WorkerView
from sessiongate.gateway.routing.belief import SessionKV
from sessiongate.gateway.routing.router import Router
from sessiongate.gateway.workers.pool import WorkerPool
from sessiongate.sglang_ext.protocol import LoadReport


def _turn(belief: KVBelief, session: str, worker: str, tokens: int, now: float) -> None:
    belief.after_turn(
        session, worker, prompt_tokens=tokens, completion_tokens=0, details={"storage_backend": "pool"}, now=now
    )


def test_a_session_evicted_by_others_turns_is_believed_in_host_then_gone() -> None:
    belief = KVBelief()
    belief.set_capacity("a", device_tokens=100, host_tokens=200)
    _turn(belief, "s", "a", 60, now=0)
    assert belief.residency("s", now=1).device == {"a": 60}
    _turn(belief, "t", "a", 50, now=2)  # 50 + 60 > 100: pushed out of the device, the host holds its copy
    kv = belief.residency("s", now=3)
    assert kv.device == {}
    assert kv.host == {"a": 60}
    assert belief.residency("t", now=3).device == {"a": 50}
    _turn(belief, "u", "a", 100, now=4)  # 100 + 50 + 60 > 200: gone from the worker; the pool copy stays
    assert belief.residency("s", now=5) == KVResidency(pool=60, last_worker="a")
    assert belief.residency("t", now=5).host == {"a": 50}
    # Long after, with nothing else touched there, what the tiers hold is still there (no time ageing).
    assert belief.residency("u", now=10_000).device == {"a": 100}


def test_a_touch_refreshes_and_other_workers_turns_do_not_count() -> None:
    belief = KVBelief()
    for worker in ("a", "b"):
        belief.set_capacity(worker, device_tokens=100, host_tokens=100)
    _turn(belief, "s", "a", 60, now=0)
    _turn(belief, "t", "b", 90, now=1)  # another worker: nothing moves on a
    assert belief.residency("s", now=2).device == {"a": 60}
    _turn(belief, "t", "a", 30, now=3)
    assert belief.residency("s", now=4).device == {"a": 60}  # 30 + 60 fit
    _turn(belief, "s", "a", 70, now=5)  # re-touched: the most recent; t's 30 + 70 still fit
    assert belief.residency("s", now=6).device == {"a": 70}
    _turn(belief, "u", "a", 25, now=7)  # 25 + 70 + 30 > 100: t (older) goes, s stays
    assert belief.residency("s", now=8).device == {"a": 70}
    t = belief.residency("t", now=8)
    assert "a" not in t.device
    assert "a" not in t.host
    assert t.device == {"b": 90}


def test_unknown_capacities_age_by_time() -> None:
    belief = KVBelief(device_ttl_s=10, host_ttl_s=100)
    belief.set_capacity("a", device_tokens=None, host_tokens=None)  # a worker without a load report
    assert belief.capacity("a") is None
    _turn(belief, "s", "a", 60, now=0)
    _turn(belief, "t", "a", 1_000_000, now=1)
    assert belief.residency("s", now=5).device == {"a": 60}
    assert belief.residency("s", now=50).host == {"a": 60}
    assert belief.residency("s", now=500).host == {}


def test_a_write_back_host_tier_holds_what_the_device_evicted() -> None:
    belief = KVBelief(host_holds_device=False)
    belief.set_capacity("a", device_tokens=100, host_tokens=100)
    _turn(belief, "s", "a", 60, now=0)
    _turn(belief, "t", "a", 60, now=1)
    _turn(belief, "u", "a", 30, now=2)  # device: t, u; host: s (device + host reach)
    assert belief.residency("s", now=3).host == {"a": 60}
    _turn(belief, "v", "a", 80, now=4)  # device: v; host: s, t, u is over 100: s goes
    assert belief.residency("s", now=5).host == {}
    assert belief.residency("t", now=5).host == {"a": 60}


def test_a_smaller_capacity_evicts_and_a_host_prefetch_lands_in_host() -> None:
    belief = KVBelief()
    belief.set_capacity("a", device_tokens=100, host_tokens=200)
    _turn(belief, "s", "a", 60, now=0)
    _turn(belief, "t", "a", 60, now=1)
    belief.set_capacity("a", device_tokens=50, host_tokens=100)
    assert belief.capacity("a") == (50, 100)
    assert belief.residency("s", now=2) == KVResidency(pool=60, last_worker="a")
    assert belief.residency("t", now=2).host == {"a": 60}
    belief.after_prefetch("s", "a", tokens=60, tier="host", now=3)
    assert belief.residency("s", now=4).host == {"a": 60}
    assert belief.residency("t", now=4).host == {}  # the prefetch pushed it out of the host tier
    belief.after_drop("s", "a")
    assert belief.residency("s", now=5).host == {}


def test_another_replicas_newer_observation_ages_by_time() -> None:
    belief = KVBelief(device_ttl_s=10)
    belief.set_capacity("a", device_tokens=100, host_tokens=100)
    _turn(belief, "s", "a", 60, now=0)
    # Another replica served s on a later; this replica's shadow has s at its old place.
    belief.replace("s", SessionKV(workers={"a": (70, "device", 20.0)}, pool=70, last_worker="a", context_tokens=70))
    _turn(belief, "t", "a", 60, now=21)  # pushes s's old entry out of this replica's shadow
    assert belief.residency("s", now=22).device == {"a": 70}  # the newer observation stands, by time
    assert belief.residency("s", now=40).host == {"a": 70}


def test_kv_aware_moves_a_session_off_a_worker_crowded_with_larger_sessions() -> None:
    a = WorkerView(id="a", url="http://a", in_flight=0, running=1, queued=0, prefill_tokens_per_s=10_000.0)
    b = WorkerView(id="b", url="http://b", in_flight=0, running=0, queued=0, prefill_tokens_per_s=10_000.0)

    def choice(belief: KVBelief) -> str:
        _turn(belief, "s", "a", 50_000, now=0)
        _turn(belief, "big-1", "a", 100_000, now=5)
        _turn(belief, "big-2", "a", 100_000, now=10)
        request = RouteRequest(
            session_id="s", tenant_id="t", prompt_tokens=52_000, kv=belief.residency("s", now=20), now=20
        )
        return KVAware().choose(request, [a, b]).id

    by_time = KVBelief()  # believes s still on a's device: staying looks free
    assert choice(by_time) == "a"
    by_capacity = KVBelief()
    by_capacity.set_capacity("a", device_tokens=196_608, host_tokens=196_608)
    by_capacity.set_capacity("b", device_tokens=196_608, host_tokens=196_608)
    assert choice(by_capacity) == "b"  # s is in the pool only: a pool read either way, and b is idle


def test_the_router_takes_the_capacities_from_the_load_report() -> None:
    pool = WorkerPool(("http://a:1",), httpx.AsyncClient(), health_timeout_s=1.0, unhealthy_after=1)
    worker = pool.workers[0]
    router = Router(KVAware(), pool, belief=KVBelief())
    router.after_turn("s", worker.id, {"prompt_tokens": 10, "completion_tokens": 2}, None)
    assert router.belief.capacity(worker.id) is None  # no report yet: by time
    worker.load = LoadReport(
        at=time.time(),
        running_requests=0,
        queued_requests=0,
        device_kv_tokens_total=1000,
        device_kv_tokens_used=0,
        host_kv_tokens_total=4000,
        prefill_tokens_per_s=0.0,
        decode_tokens_per_s=0.0,
        page_size=1,
    )
    router.after_turn("s", worker.id, {"prompt_tokens": 10, "completion_tokens": 2}, None)
    assert router.belief.capacity(worker.id) == (1000, 4000)
