#!/usr/bin/env bash
# Issue 33, 2026-11-28 night: the start interval over the concurrency the turns had (not the limit of the tick).
# "before" is an export of ef66735 (git archive ef66735 sessiongate | tar -x -C /tmp/before); "after" this tree.
set -euo pipefail
R=benchmarks/results/issue33-concurrency
LT="python -m sessiongate.benchmarks.load_test"
# 10,000 sessions, ShareGPT, 20 s think time (after, then before)
$LT --sessions 10000 --duration 300 --workload sharegpt --think-time 20 --warmup 150 --out $R/10k-after.json > $R/10k-after.txt
$LT --sessions 10000 --duration 300 --workload sharegpt --think-time 20 --warmup 150 --gateway-source /tmp/before --out $R/10k-before.json > $R/10k-before.txt
# 1,000 sessions at saturation, three pairs alternating, a quiet client timing refusals (10 a second)
for pair in 1 2 3; do
  $LT --sessions 1000 --duration 45 --shed-probe 10 --gateway-source /tmp/before --out $R/sat-before-$pair.json > $R/sat-before-$pair.txt
  $LT --sessions 1000 --duration 45 --shed-probe 10 --out $R/sat-after-$pair.json > $R/sat-after-$pair.txt
done
# the flood: 10 sessions keep 20 turns in flight each
$LT --sessions 1000 --duration 45 --warmup 12 --heavy-sessions 10 --heavy-concurrency 20 --gateway-source /tmp/before > $R/flood-before.txt
$LT --sessions 1000 --duration 45 --warmup 12 --heavy-sessions 10 --heavy-concurrency 20 > $R/flood-after.txt
# the cost per turn against smg on the same machine, one run each (22:02-22:04 UTC)
python -m sessiongate.benchmarks.router_overhead --workers 1 --concurrency 1 --no-sglang-router --no-floor > $R/router-overhead-c1.txt
python -m sessiongate.benchmarks.router_overhead --no-sglang-router --no-floor > $R/router-overhead-c16.txt
