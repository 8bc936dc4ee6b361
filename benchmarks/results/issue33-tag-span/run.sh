#!/usr/bin/env bash
# Issue 33, 2026-11-28 late night (Xeon, 480 MiB L3): a heavy session's turn tagged at most one mean turn past its
# tenant's virtual time (TAG_SPAN_TURNS 1.0), not two. "before" is an export of the tree before the change
# (git archive <rev> sessiongate | tar -x -C /tmp/before, here 4db5f63's queue); "after" the tree with the span at 1.
# Pairs alternate. The queue alone, on a simulated clock (3 seeds each, spans 2 and 1):
#   python -m sessiongate.benchmarks.admission_sim --sessions 1000 --capacity 1100 --limit 256 --think-time 0 \
#     --duration 60 --warmup 15 --conversation-turns 20 --jitter 0.5 --swing 0.3 --seed S
set -euo pipefail
R=benchmarks/results/issue33-tag-span
LT="python -m sessiongate.benchmarks.load_test"
for pair in 1 2 3; do
  $LT --sessions 1000 --duration 45 --shed-probe 10 --gateway-source /tmp/before --out $R/sat-before-$pair.json > $R/sat-before-$pair.txt
  $LT --sessions 1000 --duration 45 --shed-probe 10 --out $R/sat-after-$pair.json > $R/sat-after-$pair.txt
done
# the flood: 10 sessions keep 20 turns in flight each
$LT --sessions 1000 --duration 45 --warmup 12 --heavy-sessions 10 --heavy-concurrency 20 --gateway-source /tmp/before > $R/flood-before.txt
$LT --sessions 1000 --duration 45 --warmup 12 --heavy-sessions 10 --heavy-concurrency 20 > $R/flood-after.txt
# the queue alone (admission-sim.txt)
for seed in 0 1 2; do for span in 2 1; do
  echo "seed $seed, --tag-span-turns $span: $(python -m sessiongate.benchmarks.admission_sim --sessions 1000 --capacity 1100 \
    --limit 256 --think-time 0 --duration 60 --warmup 15 --conversation-turns 20 --jitter 0.5 --swing 0.3 --seed $seed \
    --tag-span-turns $span)"
done; done > $R/admission-sim.txt
