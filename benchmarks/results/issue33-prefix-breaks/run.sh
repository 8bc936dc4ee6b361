#!/usr/bin/env bash
# Issue 33, 2026-11-29 just after midnight (the fast Xeon): prefix breaks examined beside the turn, not in its path.
# "before" is an export of bf1d75d (git archive bf1d75d sessiongate | tar -x -C /tmp/before); "after" of the commit
# that bounds their backlog (git archive <rev> sessiongate | tar -x -C /tmp/after).
# Pairs alternate; then 10,000 sessions with the after tree.
set -euo pipefail
R=benchmarks/results/issue33-prefix-breaks
LT="python -m sessiongate.benchmarks.load_test"
for pair in 1 2 3; do
  $LT --sessions 1000 --duration 45 --shed-probe 10 --gateway-source /tmp/before --out $R/sat-before-$pair.json > $R/sat-before-$pair.txt
  $LT --sessions 1000 --duration 45 --shed-probe 10 --gateway-source /tmp/after --out $R/sat-after-$pair.json > $R/sat-after-$pair.txt
done
$LT --sessions 10000 --duration 300 --workload sharegpt --think-time 20 --warmup 150 --gateway-source /tmp/after --out $R/10k-after.json > $R/10k-after.txt
