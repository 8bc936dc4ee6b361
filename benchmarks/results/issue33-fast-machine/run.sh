#!/usr/bin/env bash
# Issue 33's targets on the fastest machine yet (2026-11-28 night: 2-core Xeon, 2 MiB L2 a core, 480 MiB L3; smg
# 135 us a turn at concurrency 16), nothing else running.
set -euo pipefail
R=benchmarks/results/issue33-fast-machine
LT="python -m sessiongate.benchmarks.load_test"
RO="python -m sessiongate.benchmarks.router_overhead --no-sglang-router"
for run in 1 2 3; do
  $LT --sessions 1000 --duration 45 --shed-probe 10 --out $R/sat-$run.json > $R/sat-$run.txt
done
$LT --sessions 10000 --duration 300 --workload sharegpt --think-time 20 --warmup 150 --out $R/10k.json > $R/10k.txt
for run in 1 2 3 4 5 6; do
  $RO --json $R/router-overhead-c16-$run.json > $R/router-overhead-c16-$run.txt
done
$RO --workers 1 --concurrency 1 --no-floor --json $R/router-overhead-c1.json > $R/router-overhead-c1.txt
$RO --concurrency 64 --no-floor --json $R/router-overhead-c64.json > $R/router-overhead-c64.txt
