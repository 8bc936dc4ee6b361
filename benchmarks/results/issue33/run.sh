#!/bin/bash
# Issue 33's figures: before (main's gateway, 10411c3, exported to /tmp/g-fair-main) and after (this branch), alternating.
cd /work/wt-g-fair
OUT=benchmarks/results/issue33
PY="/work/main/.venv/bin/python"
export PYTHONPATH=/work/wt-g-fair
MAIN="--gateway-source /tmp/g-fair-main"
run() { name=$1; shift; echo "== $name $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) :: $*" >> $OUT/log.txt; $PY -m sessiongate.benchmarks.load_test --out $OUT/$name.json "$@" > $OUT/$name.txt 2>&1; grep -E "sent|^throughput|steady|shed answered|heavy|lag|rows|RSS|handler to worker" $OUT/$name.txt >> $OUT/log.txt; }
TENK="--sessions 10000 --duration 120 --workload sharegpt --think-time 20 --warmup 45"
run tenk-fair $TENK
run tenk-main $TENK $MAIN
SAT="--sessions 1000 --duration 60 --warmup 15"
run sat-main-1 $SAT $MAIN
run sat-fair-1 $SAT
run sat-main-2 $SAT $MAIN
run sat-fair-2 $SAT
FLOOD="--sessions 1000 --duration 45 --warmup 12 --heavy-sessions 10 --heavy-concurrency 20"
run flood-main $FLOOD $MAIN
run flood-fair $FLOOD
run shed-fair-bound05 --sessions 1000 --duration 45 --warmup 12 --gateway-setting SESSIONGATE_ADMISSION_MAX_WAIT_S=0.5
run shed-fair-64pw-bound05 --sessions 1000 --duration 45 --warmup 12 --gateway-setting SESSIONGATE_ADMISSION_MAX_WAIT_S=0.5 --gateway-setting SESSIONGATE_ADMISSION_MAX_ACTIVE_PER_WORKER=64
echo "== done $(date -u +%T)" >> $OUT/log.txt
# then, with the queue as committed (the fair runs above used it from sat-fair-1 on):
# python -m sessiongate.benchmarks.load_test --out benchmarks/results/issue33/tenk-fair-2.json --sessions 10000 --duration 120 --workload sharegpt --think-time 20 --warmup 45
