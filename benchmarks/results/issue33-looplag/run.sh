#!/bin/bash
# Issue 33: the loop-lag active limit (SESSIONGATE_ADMISSION_LOOP_LAG_TARGET_MS, default 20) against a fixed limit (0),
# alternating, at saturation with the 0.5 s wait bound of the earlier shed runs (benchmarks/results/issue33/).
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/issue33-looplag
PY=.venv/bin/python
run() { name=$1; shift; echo "== $name $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) :: $*" >> $OUT/log.txt; $PY -m sessiongate.benchmarks.load_test --out $OUT/$name.json "$@" > $OUT/$name.txt 2>&1; grep -E "sent|^throughput|steady|shed answered|lag|rows|RSS|handler to worker" $OUT/$name.txt >> $OUT/log.txt; }
SHED="--sessions 1000 --duration 45 --warmup 12 --gateway-setting SESSIONGATE_ADMISSION_MAX_WAIT_S=0.5"
for i in ${PAIRS:-1 2}; do
  run shed-fixed-$i $SHED --gateway-setting SESSIONGATE_ADMISSION_LOOP_LAG_TARGET_MS=0
  run shed-looplag-$i $SHED
done
echo "== done $(date -u +%T)" >> $OUT/log.txt
