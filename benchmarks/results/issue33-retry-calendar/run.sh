#!/bin/bash
# Issue 33, return times spaced by what the gateway serves: 10,000 sessions (ShareGPT, 20 s mean think time),
# before = 07fc557 and after = 2c9ad8f (the retry calendar), each exported (git archive) to /tmp/g-before and
# /tmp/g-after; run from this folder, the repository's virtual environment active.
for side in before after; do
  echo "== $side $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> log.txt
  python -m sessiongate.benchmarks.load_test --sessions 10000 --duration 300 --workload sharegpt --think-time 20 \
    --warmup 150 --gateway-source /tmp/g-$side --out tenk-$side.json > tenk-$side.txt 2>&1
  grep -E "^throughput|steady from|shed|queue wait|handler to worker|RSS|lag" tenk-$side.txt >> log.txt
done
# And 1,000 sessions without think time (saturation), one run each, alternating.
for side in before after; do
  echo "== sat $side $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> log.txt
  python -m sessiongate.benchmarks.load_test --sessions 1000 --duration 60 --warmup 15 --gateway-source /tmp/g-$side \
    --out sat-$side.json > sat-$side.txt 2>&1
  grep -E "^throughput|steady from|shed|queue wait|handler to worker|RSS|lag" sat-$side.txt >> log.txt
done
