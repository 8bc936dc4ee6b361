#!/usr/bin/env bash
# Issue 33's cost target measured as the issue asks (median of six runs at concurrency 16, side by side on one machine),
# with both floors beside sessiongate and smg, and the added p50 at concurrency 1 (three runs); a 2-core "Intel Xeon
# Processor" (4 MiB L2, 260 MiB L3), 2026-11-29, at 200aa3f.
set -euo pipefail
R=benchmarks/results/issue33-blocked
RO="python -m sessiongate.benchmarks.router_overhead --no-sglang-router"
for i in 1 2 3 4 5 6; do
  $RO --least-stored-floor --json $R/c16-$i.json > $R/c16-$i.txt
done
for i in 1 2 3; do
  $RO --least-stored-floor --workers 1 --concurrency 1 --json $R/c1-$i.json > $R/c1-$i.txt
done
# One run with 64-turn sessions (histories up to ~129 messages): does the gateway's per-turn work grow with the history?
$RO --turns-per-session 64 --json $R/c16-64-turn-sessions.json > $R/c16-64-turn-sessions.txt
# after-last-byte/: the turn's bookkeeping moved after the answer's last byte (a patch measured and not kept; base-N is
# 200aa3f, new-N the patch), three alternating pairs of:
#   python -m sessiongate.benchmarks.router_overhead --no-sglang-router --no-floor --no-stored-floor --workers 1 --concurrency 1
# end-without-record/: three alternating pairs at concurrency 16, 200aa3f (base-N, run from its checkout in $BASE)
# and 154f6ba (new-N), a turn's end returning no record:
#   (cd "$BASE" && $RO --least-stored-floor --json ...base-N.json); $RO --least-stored-floor --json ...new-N.json
# end-without-record/c64-*: one run each at concurrency 64 (base: 200aa3f, new: 154f6ba):
#   $RO --no-floor --no-stored-floor --concurrency 64 --json ...c64-{base,new}.json
