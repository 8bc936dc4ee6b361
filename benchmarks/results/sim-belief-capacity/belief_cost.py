"""Per-turn cost of KVBelief with and without capacities: 10,000 sessions of 2k-64k tokens on 16 workers.

Run: PYTHONPATH=. python benchmarks/results/sim-belief-capacity/belief_cost.py (docs/simulator.md, "A capacity-aware
KV belief")."""
import random, time, statistics
from sessiongate.gateway.routing import KVBelief
def run(capacity: bool, sessions=10_000, workers=16, turns=200_000, device=414_000, host=828_000):
    rng = random.Random(0)
    b = KVBelief(max_sessions=100_000)
    ws = [f"w{i:02d}" for i in range(workers)]
    if capacity:
        for w in ws: b.set_capacity(w, device_tokens=device, host_tokens=host)
    ctx = {f"s{i}": int(2000 * 32 ** rng.random()) for i in range(sessions)}  # 2k-64k, log-uniform
    home = {s: rng.choice(ws) for s in ctx}
    ids = list(ctx)
    now = 0.0
    # warm: every session served once
    for s in ids:
        now += 0.01; b.after_turn(s, home[s], prompt_tokens=ctx[s], completion_tokens=200, details=None, now=now)
    order = [rng.choice(ids) for _ in range(turns)]
    moves = [rng.random() < 0.1 for _ in range(turns)]
    t_q = t_u = 0.0
    for s, move in zip(order, moves):
        now += 0.01
        a = time.perf_counter(); b.residency(s, now); t1 = time.perf_counter()
        if move: home[s] = rng.choice(ws)
        ctx[s] += 300
        t2 = time.perf_counter()
        b.after_turn(s, home[s], prompt_tokens=ctx[s], completion_tokens=200, details=None, writes_to_pool=True, now=now)
        t3 = time.perf_counter()
        t_q += t1 - a; t_u += t3 - t2
    held = sum(len(sh.device.entries) + len(sh.host.entries) for sh in b._shadows.values())
    print(f"capacity={capacity}: residency {t_q/turns*1e6:.2f} us, after_turn {t_u/turns*1e6:.2f} us, per turn {(t_q+t_u)/turns*1e6:.2f} us; shadow entries {held}")
for cap in (False, True, False, True, False, True):
    run(cap)
