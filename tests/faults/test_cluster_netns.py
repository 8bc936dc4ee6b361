"""Faults of a real network: the whole deployment in network namespaces (`benchmarks.netns_cluster`), two gateway
replicas, two real SGLang CPU workers (tiny model), PostgreSQL, Redis and the Mooncake pool, each at its own address
on one bridge; the test is the client. Links are cut (`ip link set ... down`: packets vanish, connections stay
half-open), slowed and made lossy (the pool's, through `link_relay.py`), and processes killed or stopped.

One cluster per module (its start is most of the module's time); every test leaves it as it found it. Needs root,
iproute2, /dev/net/tun, redis-server, PostgreSQL's server binaries and the Mooncake client: skipped, saying why,
without them, unless `SESSIONGATE_REQUIRE_NETNS=1` (CI), which makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.netns_cluster import ClusterError, ClusterNetwork, NetnsCluster, netns_unavailable
from sessiongate.sdk._sse import iter_events
from sessiongate.sglang_ext.mooncake import mooncake_unavailable
from sessiongate.sglang_ext.protocol import PREFETCH_PATH, PrefetchAccepted, PrefetchStatus

pytestmark = pytest.mark.engine

_UNAVAILABLE = netns_unavailable() or mooncake_unavailable()
if _UNAVAILABLE is not None:
    _WHY = f"no network-namespace cluster here: {_UNAVAILABLE} (scripts/netns-cluster.sh)"
    if os.environ.get("SESSIONGATE_REQUIRE_NETNS") == "1":
        pytest.fail(_WHY, pytrace=False)
    pytest.skip(_WHY, allow_module_level=True)

READ_TIMEOUT_S = 20.0
"""The replicas' `UPSTREAM_READ_TIMEOUT_S`: after it any pending idempotency key is taken over."""
INSTANCE_LEASE_S = 4.0
"""The replicas' `INSTANCE_LEASE_S`: after it without a heartbeat a dead replica's pending idempotency key is taken
over. Well below the read timeout, so the test tells the two apart."""
HEALTH_BOUND_S = 2 * (0.5 + 1.0) + 2.0
"""How soon a worker that stopped answering leaves routing: two failed checks (interval 0.5 s, timeout 1 s) and
slack for this shared machine."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[NetnsCluster]:
    root = Path(tempfile.mkdtemp(prefix="sessiongate-netns-"))  # outside pytest's 0700 dirs: postgres enters it
    root.chmod(0o755)
    name = f"t{os.getpid() % 100000}"
    gateway_env = {
        "SESSIONGATE_UPSTREAM_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
        "SESSIONGATE_INSTANCE_LEASE_S": str(INSTANCE_LEASE_S),
    }
    with NetnsCluster(name, root, gateway_env=gateway_env) as made:
        print(f"cluster {name} started in {made.started_in_s:.1f} s")
        yield made
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"sgc-{name}-" not in namespaces  # everything it made is gone
    shutil.rmtree(root, ignore_errors=True)  # kept when the start failed: its logs say why


@pytest.fixture
def healthy(cluster: NetnsCluster) -> Iterator[NetnsCluster]:
    """The cluster with both workers routable on both replicas, before and after the test."""
    for gateway in ("gw1", "gw2"):
        cluster.wait_routable(gateway, 2)
    yield cluster
    for gateway in ("gw1", "gw2"):
        cluster.wait_routable(gateway, 2, timeout_s=60)


def _body(content: str, **fields: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 4,
        **fields,
    }


def _turns(cluster: NetnsCluster, session_id: str, gateway: str = "gw1") -> list[dict[str, Any]]:
    answer = httpx.get(f"{cluster.gateway_url(gateway)}/v1/sessions/{session_id}/turns", timeout=30)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["data"])


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"}


def _role_of(cluster: NetnsCluster, worker_id: str) -> str:
    return next(role for role in ("wk1", "wk2") if cluster.worker_id(role) == worker_id)


def test_a_worker_whose_link_is_cut_mid_stream(healthy: NetnsCluster) -> None:
    cluster = healthy
    url = cluster.gateway_url("gw1")
    messages = [{"role": "user", "content": "Count slowly from one to one hundred."}]
    body = {"model": "tiny", "messages": messages, "stream": True, "max_tokens": 2000, "temperature": 0}
    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"x-session-id": "cut-1"}, timeout=120
    ) as response:
        assert response.status_code == 200
        victim = _role_of(cluster, response.headers["x-sessiongate-worker"])
        for event in iter_events(response.iter_lines()):
            if event.done:
                break
            events.append(event.json())
            if len(events) == 4:
                cluster.net.cut(victim)
                cut_at = time.monotonic()
    try:
        failed_after_s = time.monotonic() - cut_at
        print(f"link of {victim} cut mid-stream: the stream ended {failed_after_s:.1f} s later")
        assert events[-1]["error"]["code"] == "worker_unreachable"  # the client is told, in the stream
        assert "unreachable mid-stream" in events[-1]["error"]["message"]
        assert failed_after_s < HEALTH_BOUND_S + 2  # not the read timeout: the health checks cannot connect
        turns = _turns(cluster, "cut-1")
        assert [t["status"] for t in turns] == ["failed"]
        assert turns[0]["worker"] == cluster.worker_id(victim)
        assert turns[0]["error"]["type"] == "WorkerUnreachable"
        assert turns[0]["output_message"]["content"]  # what was streamed is kept with the failure

        # The session's next turn goes to the other worker, with the answer that worker gives directly.
        survivor = "wk2" if victim == "wk1" else "wk1"
        ask = _body("Just say hello.", max_tokens=8)
        answer = httpx.post(f"{url}/v1/chat/completions", json=ask, headers={"x-session-id": "cut-1"}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-sessiongate-worker"] == cluster.worker_id(survivor)
        direct = httpx.post(f"{cluster.worker_url(survivor)}/v1/chat/completions", json=ask, timeout=60).json()
        assert answer.json()["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
        assert [t["status"] for t in _turns(cluster, "cut-1")] == ["failed", "ok"]
    finally:
        cluster.net.heal(victim)


def test_a_half_open_worker_leaves_routing_within_the_health_bound(healthy: NetnsCluster) -> None:
    """The worker's host still accepts connections (the kernel does) but its processes never answer (SIGSTOP)."""
    cluster = healthy
    cluster.net.signal("wk2", signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        for gateway in ("gw1", "gw2"):
            cluster.wait_routable(gateway, 1, timeout_s=HEALTH_BOUND_S + 5)
        out_after_s = time.monotonic() - stopped
        print(f"a half-open worker left routing on both replicas after {out_after_s:.1f} s")
        assert out_after_s < HEALTH_BOUND_S
        for gateway in ("gw1", "gw2"):
            answer = httpx.post(
                f"{cluster.gateway_url(gateway)}/v1/chat/completions",
                json=_body("still here?", max_tokens=4),
                headers={"x-session-id": f"half-open-{gateway}"},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-sessiongate-worker"] == cluster.worker_id("wk1")
    finally:
        cluster.net.signal("wk2", signal.SIGCONT)


def test_redis_unreachable_replicas_decide_locally_and_converge(healthy: NetnsCluster) -> None:
    cluster = healthy
    urls = [cluster.gateway_url(g) for g in ("gw1", "gw2")]
    for url in urls:
        assert httpx.get(f"{url}/readyz", timeout=10).json()["checks"]["shared_state"] == "ok"
    failures_before = [_metrics(url).get("sessiongate_shared_state_failures_total", 0.0) for url in urls]
    with cluster.link_cut("rd"):
        for i, url in enumerate(urls):
            started = time.monotonic()
            ready = httpx.get(f"{url}/readyz", timeout=10)
            assert ready.status_code == 200  # still serving: Redis is not a condition of readiness
            assert ready.json()["checks"]["shared_state"].startswith("unavailable, deciding with this replica's")
            assert time.monotonic() - started < 3  # the Redis timeout (0.5 s), not a hang
            answer = httpx.post(
                f"{url}/v1/chat/completions",
                json=_body("with no Redis", max_tokens=4),
                headers={"x-session-id": f"no-redis-{i}"},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            samples = _metrics(url)
            assert samples["sessiongate_shared_state_available"] == 0
            assert samples["sessiongate_shared_state_failures_total"] > failures_before[i]
    deadline = time.monotonic() + 15
    for url in urls:  # back: each replica finds Redis again by itself (no restart)
        while httpx.get(f"{url}/readyz", timeout=10).json()["checks"]["shared_state"] != "ok":
            assert time.monotonic() < deadline, "a replica did not find Redis again"
            time.sleep(0.3)
        assert _metrics(url)["sessiongate_shared_state_available"] == 1


def test_postgres_unreachable_for_ten_seconds(healthy: NetnsCluster) -> None:
    cluster = healthy
    url = cluster.gateway_url("gw1")
    before = httpx.post(
        f"{url}/v1/chat/completions", json=_body("before"), headers={"x-session-id": "pg-1"}, timeout=60
    )
    assert before.status_code == 200, before.text
    answered: list[str] = []
    refused: list[tuple[int, str | None, float]] = []
    # A turn accepted before the cut and answered during it: its recording waits for the store, it is not lost.
    streamed: list[bytes] = []

    def accepted_turn() -> None:
        body = _body("accepted before the cut", stream=True, max_tokens=300)
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"x-session-id": "pg-2"}, timeout=120
        ) as response:
            streamed.extend(response.iter_bytes())

    thread = threading.Thread(target=accepted_turn, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while len(streamed) < 2:
        assert time.monotonic() < deadline, "the accepted turn did not stream"
        time.sleep(0.01)
    with cluster.link_cut("pg"):
        cut_at = time.monotonic()
        while time.monotonic() - cut_at < 10:
            content = f"during {len(answered) + len(refused)}"
            started = time.monotonic()
            try:
                answer = httpx.post(
                    f"{cluster.gateway_url('gw2' if len(refused) % 2 else 'gw1')}/v1/chat/completions",
                    json=_body(content, max_tokens=4),
                    headers={"x-session-id": "pg-1"},
                    timeout=60,
                )
            except httpx.HTTPError as exc:
                pytest.fail(f"no answer while PostgreSQL was unreachable: {exc!r}")
            if answer.status_code == 200:
                answered.append(content)
            else:
                refused.append((answer.status_code, answer.headers.get("retry-after"), time.monotonic() - started))
                assert answer.json()["error"]["code"] == "store_unavailable", answer.text
    print(f"while PostgreSQL was unreachable: {len(answered)} answered, refused {refused}")
    assert refused
    assert all(status == 503 and retry_after is not None for status, retry_after, _ in refused)
    assert all(seconds < 12 for _, _, seconds in refused)

    # Back without a restart; every turn that was answered is in the store, none half-made.
    deadline = time.monotonic() + 30
    while True:
        answer = httpx.post(
            f"{url}/v1/chat/completions", json=_body("after"), headers={"x-session-id": "pg-1"}, timeout=60
        )
        if answer.status_code == 200:
            break
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.5)
    deadline = time.monotonic() + 30
    while True:
        turns = _turns(cluster, "pg-1")
        contents = [t["input_messages"][-1]["content"] for t in turns if t["status"] == "ok"]
        if contents == ["before", *answered, "after"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert contents == ["before", *answered, "after"]
    assert {t["status"] for t in turns} == {"ok"}
    thread.join(60)
    assert b"[DONE]" in b"".join(streamed)
    deadline = time.monotonic() + 30
    while (statuses := [t["status"] for t in _turns(cluster, "pg-2")]) != ["ok"]:
        assert time.monotonic() < deadline, f"the turn answered during the outage is {statuses}"
        time.sleep(0.5)


def _prefetch_and_answer(client: httpx.Client, messages: list[dict[str, Any]]) -> tuple[float, PrefetchStatus, str]:
    """Prefetch the context from the pool onto the worker's device (timed), then the greedy answer."""
    client.post("/flush_cache", params={"timeout": 30}).raise_for_status()
    started = time.perf_counter()
    accepted = PrefetchAccepted.model_validate(
        client.post(PREFETCH_PATH, json={"session_id": "pool", "messages": messages[:-1], "target": "device"}).json()
    )
    while True:
        status = PrefetchStatus.model_validate(client.get(f"{PREFETCH_PATH}/{accepted.prefetch_id}").json())
        if status.state not in ("queued", "running"):
            break
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    body = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 8}
    answer = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    return seconds, status, str(answer)


def test_a_slow_lossy_pool_link_slows_prefetches_not_answers(healthy: NetnsCluster) -> None:
    cluster = healthy
    facts = "\n".join(f"Fact {i}: page {i * 7} of the pool is on node {i % 3}." for i in range(80))
    messages = [
        {"role": "system", "content": f"You are terse.\n{facts}"},
        {"role": "user", "content": "Which node holds page 35?"},
        {"role": "assistant", "content": "Node 2."},
        {"role": "user", "content": "And page 70?"},
    ]
    body = {"model": "tiny", "messages": messages[:-1], "temperature": 0, "max_tokens": 1}
    with httpx.Client(base_url=cluster.worker_url("wk1"), timeout=120) as wk1:
        wk1.post("/v1/chat/completions", json=body).raise_for_status()  # computed on wk1, written to the pool
        computed = wk1.post("/v1/chat/completions", json={**body, "messages": messages, "max_tokens": 8}).json()
    assert cluster.master is not None
    deadline = time.monotonic() + 60
    while len([k for k in cluster.master.keys() if "warmup" not in k]) < 2:  # noqa: SIM118 (a method)
        assert time.monotonic() < deadline, "nothing written through to the pool"
        time.sleep(0.2)
    time.sleep(1)  # the write-through of the last pages
    with httpx.Client(base_url=cluster.worker_url("wk2"), timeout=120) as wk2:
        # The best of two on the clean link: once (after the faults of the tests before) a first read took 26 s.
        first_s, _, _ = _prefetch_and_answer(wk2, messages)
        clean_s, clean, clean_answer = _prefetch_and_answer(wk2, messages)
        clean_s = min(first_s, clean_s)
        cluster.net.shape("mc", delay_ms=50, loss_pct=5)
        try:
            faulty_s, faulty, faulty_answer = _prefetch_and_answer(wk2, messages)
        finally:
            cluster.net.shape("mc", delay_ms=0, loss_pct=0)
    print(
        f"prefetch from the pool: {clean_s:.3f} s on a clean link ({clean.bytes_loaded} bytes), {faulty_s:.3f} s "
        f"with 50 ms each way and 5% loss ({faulty.bytes_loaded} bytes, {faulty.pages_unavailable} pages given up)"
    )
    assert clean.state == "done"
    assert faulty.state == "done"
    assert clean.bytes_loaded
    assert clean.pages_unavailable == 0
    # Over the faulty link the pages arrive late, or the read gives up (the pool's transfer timed out: a miss,
    # so the worker computes the prefix instead). Either way it costs time, never a different answer.
    assert faulty.bytes_loaded == clean.bytes_loaded or faulty.pages_unavailable > 0
    assert faulty_s > clean_s + 0.1  # at least a round trip of 100 ms more
    assert faulty_answer == clean_answer == computed["choices"][0]["message"]["content"]


def test_a_replica_killed_with_a_turn_in_flight_the_retry_makes_one_turn(healthy: NetnsCluster) -> None:
    cluster = healthy
    body = _body("Count slowly from one to one hundred.", stream=True, max_tokens=2000)
    headers = {"x-session-id": "idem-1", "idempotency-key": "idem-key-1"}
    received: list[bytes] = []

    def first() -> None:
        try:
            with httpx.stream(
                "POST", f"{cluster.gateway_url('gw1')}/v1/chat/completions", json=body, headers=headers, timeout=60
            ) as response:
                for chunk in response.iter_bytes():
                    received.append(chunk)
        except httpx.HTTPError:
            received.append(b"<cut>")

    thread = threading.Thread(target=first, daemon=True)
    sent = time.monotonic()  # the key is claimed after this: the read timeout frees it READ_TIMEOUT_S later at best
    thread.start()
    deadline = time.monotonic() + 30
    while len(received) < 3:
        assert time.monotonic() < deadline, "the first request did not stream"
        time.sleep(0.02)
    cluster.net.signal("gw1", signal.SIGKILL)  # the replica dies with the turn in flight
    killed = time.monotonic()
    thread.join(30)
    assert b"[DONE]" not in b"".join(received)

    # The client retries on the other replica with the same key until it is answered: one turn, not two, and as
    # soon as the dead replica's lease lapses, not after the read timeout.
    statuses: list[int] = []
    deadline = time.monotonic() + READ_TIMEOUT_S + 30
    while True:
        with httpx.stream(
            "POST", f"{cluster.gateway_url('gw2')}/v1/chat/completions", json=body, headers=headers, timeout=120
        ) as retry:
            statuses.append(retry.status_code)
            if retry.status_code == 200:
                answered = time.monotonic()
                text = retry.read().decode()
                break
            assert retry.status_code == 409, retry.read()
            assert retry.headers["retry-after"] == "1"
        assert time.monotonic() < deadline, statuses
        time.sleep(1)
    assert "[DONE]" in text
    print(
        f"retries on the other replica: {len(statuses)} ({statuses[0]} first, then {statuses[-1]}), "
        f"answered {answered - killed:.1f} s after the kill"
    )
    assert answered - sent < READ_TIMEOUT_S  # the dead replica's lease freed the key, not the read timeout
    assert answered - killed < INSTANCE_LEASE_S + 5  # the lease, a retry's second and slack for the loaded machine
    replay = httpx.post(f"{cluster.gateway_url('gw2')}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert replay.headers["idempotent-replayed"] == "true"  # a third try gets the same answer, no new turn

    cluster.start_gateway("gw1")  # back: it fails the turn its dead run left pending, at once
    turns = _turns(cluster, "idem-1", "gw1")
    assert [t["status"] for t in turns] == ["failed", "ok"]
    assert turns[0]["error"]["type"] == "interrupted"
    assert turns[1]["output_message"]["content"]


def test_a_failed_up_leaves_nothing_behind() -> None:
    """`up` that fails half way (the second node's name is refused) removes the bridge and namespace it made."""
    name = f"f{os.getpid() % 100000}"
    network = ClusterNetwork(name, ("a", "BAD"), relayed=())
    with pytest.raises(ClusterError, match="ROLE must be"):
        network.__enter__()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"sgc-{name}-" not in namespaces
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    assert f"sgc-{name}" not in links
    assert f"sgc{name}-" not in links
