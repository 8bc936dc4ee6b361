#!/bin/bash
# Issue 33, the cyclic collector: three pairs alternating, before = af5df02, after = the tree of the commit that
# added `server_protocol.tune_collector`, each exported (git archive) to /tmp/g-before and /tmp/g-after.
# gcprobe_sitecustomize.py, copied into both trees as sitecustomize.py, times every collection in the gateway
# process (gc.callbacks) and writes a summary; in these runs it wrote one only every 200 collections, so the
# "after" runs' figures in log.txt stop at start-up (the tuned gateway never reached 200 more).
cd /work/main
for pair in 1 2 3; do
 for side in before after; do
  echo "== $pair $side $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> log.txt
  python -m sessiongate.benchmarks.load_test --sessions 1000 --duration 60 --warmup 15 --gateway-source /tmp/g-$side --out $side-$pair.json > $side-$pair.txt 2>&1
  grep -E "^throughput|steady from|shed answered|RSS|lag" $side-$pair.txt >> log.txt
 done
done
