#!/usr/bin/env bash
# Issue 27, 2026-11-28 late night: the same hints on Dynamo's cost router (the strongest baseline), with its oracle,
# on the two workloads where the oracle gained most over kv_aware (D: long agents; H: chat), seeds 0-2; on chat
# also the typing hints timed by the gateway (-timed) and told their turn's exact time (-exact), with every lead
# 11.3 s (sigma 0) and with leads drawn around 11.3 s (--lead-sigma 0.5).
set -euo pipefail
R=benchmarks/results/sim-hints-on-dynamo
SIM="python -m sessiongate.benchmarks.sim --calibration h100 --workers 16"
D="cache_aware dynamo_cost dynamo_cost+advisories dynamo_cost+toolkv dynamo_cost+oracle kv_aware kv_aware+toolkv kv_aware+oracle"
H="cache_aware dynamo_cost dynamo_cost+advisories dynamo_cost+advisories-timed dynamo_cost+advisories-exact
   dynamo_cost+oracle kv_aware kv_aware+advisories kv_aware+advisories-timed kv_aware+oracle"
for seed in 0 1 2; do
  $SIM --trace agent-long --min-context 64000 --max-context 128000 --rounds 200 --tool-scale 40 \
    --sessions-per-user 1 --device-kv-tokens 196608 --host-kv-tokens 196608 --pool-link-gbps 50 \
    --loads 8 12 16 24 32 48 --system $D --slo-p99-ttft 2 --seed $seed --out $R/D-seed$seed
  for sigma in 0 0.5; do
    $SIM --trace sharegpt --token-scale 4 --max-context 4000 --sessions-per-user 6 --think-time 20 \
      --device-kv-tokens 16384 --host-kv-tokens 16384 --pool-link-gbps 25 --loads 32 64 96 128 --lead-sigma $sigma \
      --system $H --slo-p99-ttft 1 --seed $seed --out $R/H-sigma$sigma-seed$seed
  done
done
