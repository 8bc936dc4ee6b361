"""The routing policies and the cost model, on hand-built states (pure: no app, no I/O)."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from sessiongate.gateway.routing import (
    CacheAware,
    CostModel,
    KVAware,
    KVBelief,
    KVResidency,
    LeastLoaded,
    Reservation,
    RoundRobin,
    RouteRequest,
    Sticky,
    WorkerView,
    make_policy,
    split_prompt,
)
from sessiongate.gateway.routing.router import Router, prompt_chars, prompt_text
from sessiongate.gateway.workers.pool import WorkerPool

A = WorkerView(id="a", url="http://a", in_flight=0)
B = WorkerView(id="b", url="http://b", in_flight=0)
C = WorkerView(id="c", url="http://c", in_flight=0)


def _loaded(worker: WorkerView, running: int, queued: int = 0, prefill: float | None = 1000.0) -> WorkerView:
    return WorkerView(
        id=worker.id, url=worker.url, in_flight=0, running=running, queued=queued, prefill_tokens_per_s=prefill
    )


def _request(**kw: object) -> RouteRequest:
    return RouteRequest(session_id="s", tenant_id="t", **kw)  # type: ignore[arg-type]


def test_load_is_the_report_plus_what_was_sent_since_else_in_flight() -> None:
    assert WorkerView(id="a", url="", in_flight=3).load == 3
    reported = WorkerView(id="a", url="", in_flight=3, running=5, queued=2, in_flight_since_report=1)
    assert reported.load == 8


def test_round_robin_rotates_over_all_workers() -> None:
    policy = RoundRobin()
    busy = _loaded(B, running=100)
    assert [policy.choose(_request(), [A, busy, C]).id for _ in range(4)] == ["a", "b", "c", "a"]


def test_least_loaded_picks_fewest_and_rotates_ties() -> None:
    policy = LeastLoaded()
    assert policy.choose(_request(), [_loaded(A, 5), _loaded(B, 1), _loaded(C, 3)]).id == "b"
    chosen = {policy.choose(_request(), [A, B]).id for _ in range(4)}
    assert chosen == {"a", "b"}


def test_sticky_follows_the_last_worker_while_routable() -> None:
    policy = Sticky()
    kv = KVResidency(last_worker="b")
    assert policy.choose(_request(kv=kv), [_loaded(A, 0), _loaded(B, 50)]).id == "b"
    # b left the pool: the least loaded of the others.
    assert policy.choose(_request(kv=kv), [_loaded(A, 4), _loaded(C, 1)]).id == "c"


def test_split_prompt_by_fastest_tier() -> None:
    kv = KVResidency(device={"a": 100}, host={"a": 300, "b": 50}, pool=600)
    assert split_prompt(1000, kv, "a") == (split := split_prompt(1000, kv, "a"))
    assert (split.device, split.host, split.pool, split.recompute) == (100, 200, 300, 400)
    on_b = split_prompt(1000, kv, "b")
    assert (on_b.device, on_b.host, on_b.pool, on_b.recompute) == (0, 50, 550, 400)
    # A prompt shorter than what is cached is all found.
    short = split_prompt(80, kv, "a")
    assert (short.device, short.host, short.pool, short.recompute) == (80, 0, 0, 0)


def test_cost_model_formulas() -> None:
    cost = CostModel(
        typical_prefill_tokens=500,
        default_prefill_tokens_per_s=1000.0,
        kv_bytes_per_token=1000,
        host_to_device_bytes_per_s=1e6,
        pool_to_device_bytes_per_s=1e5,
    )
    worker = WorkerView(
        id="a",
        url="",
        in_flight=9,
        running=20,
        queued=3,
        in_flight_since_report=1,
        prefill_tokens_per_s=2000.0,
        decode_tokens_per_s=400.0,
    )
    # 4 queued (3 reported, 1 sent since) * 500 / 2000 + one decode step of the running batch, 20 / 400.
    assert cost.wait_s(worker) == pytest.approx(1.0 + 0.05)
    kv = KVResidency(device={"a": 100}, host={"a": 200}, pool=300)
    # 100 on device: free; 100 from host: 100*1000/1e6; 100 from pool: 100*1000/1e5; 700 recomputed at 2000/s.
    assert cost.score_s(1000, kv, worker) == pytest.approx(1.05 + 0.1 + 1.0 + 0.35)
    # A worker with no report: the gateway's in-flight count and the default prefill rate.
    unreported = WorkerView(id="b", url="", in_flight=1)
    assert cost.score_s(1000, KVResidency(), unreported) == pytest.approx(0.5 + 1.0)
    # A fixed cost per move, paid once per tier that has anything to bring (none for device hits or recompute).
    slow_moves = dataclasses.replace(cost, host_to_device_latency_s=0.006, pool_to_device_latency_s=0.02)
    assert slow_moves.score_s(1000, kv, worker) == pytest.approx(1.05 + 0.1 + 1.0 + 0.35 + 0.006 + 0.02)
    assert slow_moves.score_s(100, kv, worker) == pytest.approx(1.05)
    assert slow_moves.score_s(1000, KVResidency(), worker) == pytest.approx(1.05 + 0.5)


def test_kv_aware_stays_with_the_kv_until_the_queue_costs_more() -> None:
    policy = KVAware(CostModel(typical_prefill_tokens=500, default_prefill_tokens_per_s=1000.0))
    kv = KVResidency(device={"a": 4000}, pool=0)
    # Recomputing 4000 tokens on b (4 s) costs more than waiting behind 2 queued requests on a (1 s).
    assert policy.choose(_request(prompt_tokens=4000, kv=kv), [_loaded(A, 0, 2), _loaded(B, 0)]).id == "a"
    # Behind 10 (5 s), b's recompute is cheaper.
    assert policy.choose(_request(prompt_tokens=4000, kv=kv), [_loaded(A, 0, 10), _loaded(B, 0)]).id == "b"
    # A big running batch costs one decode step, not a queue: a keeps it.
    assert policy.choose(_request(prompt_tokens=4000, kv=kv), [_loaded(A, 64), _loaded(B, 0)]).id == "a"


def test_kv_aware_pool_makes_the_least_loaded_worker_cheap() -> None:
    policy = KVAware(CostModel(typical_prefill_tokens=500, default_prefill_tokens_per_s=1000.0))
    kv = KVResidency(device={"a": 4000}, pool=4000)  # written through: any worker reads it from the pool
    choice = policy.choose(_request(prompt_tokens=4000, kv=kv), [_loaded(A, 0, 2), _loaded(B, 0)])
    assert choice.id == "b"  # 4000 tokens * 128 KiB / 2 GB/s = 0.26 s < 1 s of queueing on a


def test_kv_aware_counts_the_device_memory_running_sequences_hold() -> None:
    # Both workers run one sequence and queue nothing; a's sequences hold 30k of its 32k-token pool, b's 2k.
    cost = CostModel(typical_prefill_tokens=500, default_prefill_tokens_per_s=10_000.0)
    policy = KVAware(cost)

    def holding(worker: WorkerView, active: int) -> WorkerView:
        return WorkerView(
            id=worker.id,
            url=worker.url,
            in_flight=0,
            running=1,
            queued=0,
            active_prefill_tokens=0,
            active_kv_tokens=active,
            device_kv_tokens=32_768,
        )

    full, roomy = holding(A, 30_000), holding(B, 2_000)
    # The session's 8k-token context is on a's device: before, a won (its KV saves 0.8 s of prefill); now a newcomer
    # there waits for memory: 30k tokens of work ahead at a full pool (3 s), against b's 2k x 31% (0.06 s).
    kv = KVResidency(device={"a": 8000})
    assert cost.memory_wait_s(8200, full) == pytest.approx(3.0)
    assert cost.memory_wait_s(8200, roomy) == pytest.approx(2000 * (10_200 / 32_768) / 10_000)
    assert policy.choose(_request(prompt_tokens=8200, kv=kv), [full, roomy]).id == "b"
    # With memory to spare the same KV keeps the session where it is.
    assert policy.choose(_request(prompt_tokens=8200, kv=kv), [holding(A, 4_000), roomy]).id == "a"
    # No figures (a worker without the extension, a stale report): no memory term.
    assert cost.memory_wait_s(8200, A) == 0.0


def test_kv_aware_honours_a_reservation_within_the_margin_only() -> None:
    policy = KVAware(
        CostModel(typical_prefill_tokens=500, default_prefill_tokens_per_s=1000.0), reservation_margin_s=0.6
    )
    workers = [_loaded(A, 0, 1), _loaded(B, 0)]  # a is 0.5 s worse than b
    kept = _request(reservation=Reservation(worker_id="a", expires_at=10.0), now=5.0)
    assert policy.choose(kept, workers).id == "a"
    expired = _request(reservation=Reservation(worker_id="a", expires_at=10.0), now=11.0)
    assert policy.choose(expired, workers).id == "b"
    beyond = [_loaded(A, 0, 2), _loaded(B, 0)]  # 1 s worse: beyond the margin, dropped
    assert policy.choose(kept, beyond).id == "b"
    gone = _request(reservation=Reservation(worker_id="z", expires_at=10.0), now=5.0)
    assert policy.choose(gone, workers).id == "b"


def test_kv_aware_a_landed_reservation_only_breaks_ties() -> None:
    # Its prefetch finished: the KV belief shows the KV there, so the margin would only hold the request on a worker
    # that got busier since.
    policy = KVAware(
        CostModel(typical_prefill_tokens=500, default_prefill_tokens_per_s=1000.0), reservation_margin_s=0.6
    )
    landed = _request(reservation=Reservation(worker_id="a", expires_at=10.0, landed=True), now=5.0)
    assert policy.choose(landed, [_loaded(A, 0, 1), _loaded(B, 0)]).id == "b"  # 0.5 s worse: not kept
    assert policy.choose(landed, [_loaded(A, 0), _loaded(B, 0)]).id == "a"  # a tie goes to the reservation
    under_way = _request(reservation=Reservation(worker_id="a", expires_at=10.0), now=5.0)
    assert policy.choose(under_way, [_loaded(A, 0, 1), _loaded(B, 0)]).id == "a"


def test_a_reservation_lands_when_its_prefetch_is_ready() -> None:
    from sessiongate.gateway.advisor.core import AdvisorBook, LiveAdvisory

    book = AdvisorBook(ttl_s=30.0)
    advisory = LiveAdvisory("adv", "s", "t", "typing", "a", "device", created_at=0.0, fire_at=0.0, expires_at=30.0)
    book.add(advisory)
    book.due(0.0)
    reservation = book.reservation("s", 1.0)
    assert reservation is not None
    assert not reservation.landed
    advisory.ready_at = 2.0
    assert book.reservation("s", 1.5) == Reservation(worker_id="a", expires_at=30.0, landed=False)
    assert book.reservation("s", 2.5) == Reservation(worker_id="a", expires_at=30.0, landed=True)


def test_cache_aware_prefix_affinity_then_smallest_index() -> None:
    policy = CacheAware()
    system = "You are a helpful travel assistant who answers briefly. " * 4
    first = policy.choose(_request(prompt_text=system + "user: hello"), [A, B])
    # The same conversation, extended: its blocks match far more than 30% of the text.
    again = policy.choose(_request(prompt_text=system + "user: hello. assistant: hi. user: more"), [A, B])
    assert again.id == first.id
    # An unrelated text matches nothing: the worker with the smaller index gets it, and remembers it.
    unrelated = "A completely different conversation about the weather in Porto. " * 4
    other = policy.choose(_request(prompt_text=unrelated), [A, B])
    assert other.id != first.id
    assert policy.choose(_request(prompt_text=unrelated + "more"), [A, B]).id == other.id
    # Sharing only a short prefix (under the threshold) is not affinity.
    shared_little = system[:40] + "x" * 400
    smaller = min((A, B), key=lambda w: (policy._index(w.id).size, w.id))
    assert policy.choose(_request(prompt_text=shared_little), [A, B]).id == smaller.id


def test_cache_aware_balance_thresholds() -> None:
    text = "shared prefix " * 10

    def seeded() -> CacheAware:
        policy = CacheAware()
        policy.choose(_request(prompt_text=text), [A])  # a holds the prefix
        return policy

    # Imbalanced by both rules (diff 70 > 64 and 80 > 10 * 1.5): least loaded, despite the prefix on a.
    assert seeded().choose(_request(prompt_text=text), [_loaded(A, 80), _loaded(B, 10)]).id == "b"
    # A difference over 64 but a ratio under 1.5 is not imbalanced: the prefix wins.
    assert seeded().choose(_request(prompt_text=text), [_loaded(A, 200), _loaded(B, 140)]).id == "a"
    # A ratio over 1.5 but a difference under 64: the prefix wins.
    assert seeded().choose(_request(prompt_text=text), [_loaded(A, 30), _loaded(B, 1)]).id == "a"


def test_make_policy_by_name() -> None:
    for name in ("round_robin", "least_loaded", "sticky", "cache_aware", "kv_aware"):
        assert make_policy(name).name == name
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_policy("random")


def test_belief_from_turns_prefetches_and_ageing() -> None:
    belief = KVBelief(device_ttl_s=10, host_ttl_s=100)
    belief.after_turn("s", "a", prompt_tokens=90, completion_tokens=10, details={"storage_backend": "file"}, now=0)
    kv = belief.residency("s", now=1)
    assert kv.device == {"a": 100}
    assert kv.pool == 100
    assert kv.last_worker == "a"
    belief.after_prefetch("s", "b", tokens=100, tier="host", now=2)
    assert belief.residency("s", now=3).host == {"b": 100}
    # Device beliefs age into host, host beliefs into nothing (the pool copy stays).
    later = belief.residency("s", now=50)
    assert later.device == {}
    assert later.host == {"a": 100, "b": 100}
    assert belief.residency("s", now=500) == KVResidency(pool=100, last_worker="a")
    belief.after_drop("s")
    assert belief.residency("s", now=1) == KVResidency()


def test_belief_without_a_pool_keeps_pool_empty() -> None:
    belief = KVBelief()
    belief.after_turn("s", "a", prompt_tokens=10, completion_tokens=5, details={"device": 0, "storage": 0}, now=0)
    assert belief.residency("s", now=0).pool == 0
    belief.after_turn("t", "a", prompt_tokens=10, completion_tokens=5, details=None, now=0)
    assert belief.residency("t", now=0).pool == 0


def test_belief_of_a_cold_turn_on_a_worker_that_writes_to_the_pool() -> None:
    # SGLang sends no cache report for a prompt without hits: only the worker's load report tells of its pool.
    belief = KVBelief()
    belief.after_turn("s", "a", prompt_tokens=90, completion_tokens=10, details=None, writes_to_pool=True, now=0)
    assert belief.residency("s", now=0).pool == 100


# the router's view of a request's prompt

_MESSAGES: list[dict[str, object]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url"}, "not a part"]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "content": "found é", "tool_call_id": "c1"},
    {"role": "assistant", "content": ""},
    {"role": "user", "content": 42},
    {"role": "user", "content": {"odd": True}, "tool_calls": ["not a call"]},
    {"content": "no role"},
    {"role": 7, "content": "odd role", "tool_calls": []},
    {"role": "assistant", "content": "calling", "tool_calls": [{"function": {"name": "g"}}]},
]


@pytest.mark.parametrize("upto", range(len(_MESSAGES) + 1))
def test_prompt_chars_counts_the_prompt_text_without_building_it(upto: int) -> None:
    assert prompt_chars(_MESSAGES[:upto]) == len(prompt_text(_MESSAGES[:upto]))


def test_the_router_builds_the_prompt_text_only_for_a_policy_that_matches_on_it() -> None:
    pool = WorkerPool((), httpx.AsyncClient(), health_timeout_s=1.0, unhealthy_after=1)
    by_text = Router(CacheAware(), pool).route_request("s", "t", _MESSAGES)
    by_cost = Router(KVAware(), pool).route_request("s", "t", _MESSAGES)
    assert by_text.prompt_text == prompt_text(_MESSAGES)
    assert by_cost.prompt_text == ""
    assert by_text.prompt_tokens == by_cost.prompt_tokens == len(prompt_text(_MESSAGES)) // 4


def test_a_known_context_takes_its_tokens_from_the_belief_and_only_new_messages_are_counted() -> None:
    pool = WorkerPool((), httpx.AsyncClient(), health_timeout_s=1.0, unhealthy_after=1)
    router = Router(KVAware(), pool)
    history, new = _MESSAGES[:5], _MESSAGES[5:]
    everything = len(prompt_text(_MESSAGES)) // 4
    # No belief of the session yet: the whole request is counted, whatever the store knew.
    assert router.route_request("s", "t", _MESSAGES, known_prefix=5).prompt_tokens == everything
    router.belief.after_turn("s", "a", prompt_tokens=900, completion_tokens=100, details=None, now=0.0)
    known = router.route_request("s", "t", _MESSAGES, known_prefix=len(history))
    assert known.prompt_tokens == 1000 + len(prompt_text(new)) // 4
    # A request that restarts the context (known_prefix 0) is counted whole, and never below the belief's count.
    assert router.route_request("s", "t", _MESSAGES).prompt_tokens == max(everything, 1000)
    assert router.choose("s", "t", _MESSAGES, known_prefix=5) is None  # no routable worker: nothing to choose
