#!/usr/bin/env bash
# Issue 33, 2026-11-28 night, the 2-core AMD machine: a return on time to a queue past 1.5x the bound is told again.
# "before" is an export of 5406213 (git archive 5406213 sessiongate | tar -x -C /tmp/before2); "after" this tree.
set -euo pipefail
R=benchmarks/results/issue33-retell
LT="python -m sessiongate.benchmarks.load_test"
for tree in after before; do
  src=(); [ $tree = before ] && src=(--gateway-source /tmp/before2)
  $LT --sessions 10000 --duration 150 --workload sharegpt --think-time 20 --warmup 75 "${src[@]}" --out $R/10k-$tree.json > $R/10k-$tree.txt
done
for tree in before after; do
  src=(); [ $tree = before ] && src=(--gateway-source /tmp/before2)
  $LT --sessions 1000 --duration 45 --shed-probe 10 "${src[@]}" --out $R/sat-$tree.json > $R/sat-$tree.txt
done
# the queue alone on a simulated clock, the capacity falling by 60% over the run; before: 5406213's queue under
# this tree's simulator (which has --fall)
python -m sessiongate.benchmarks.admission_sim --fall 0.6 > $R/sim-fall-after.txt
cp sessiongate/benchmarks/admission_sim.py /tmp/before2/sessiongate/benchmarks/admission_sim.py
(cd /tmp/before2 && PYTHONPATH=/tmp/before2 python -m sessiongate.benchmarks.admission_sim --fall 0.6) > $R/sim-fall-before.txt
