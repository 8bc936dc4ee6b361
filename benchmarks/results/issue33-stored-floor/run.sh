#!/usr/bin/env bash
# The stored floor (the floor proxy recording every turn through the gateway's store) beside sessiongate and smg, and
# the streamed relay's change (ab004da), on a 2-core "Intel Xeon Processor" (4 MiB L2, 300 MiB L3; smg 208-299 us a
# non-streamed turn at concurrency 16), 2026-11-29. BASE: a checkout of 9c6c525 (the tree before this stop).
set -euo pipefail
R=benchmarks/results/issue33-stored-floor
RO="python -m sessiongate.benchmarks.router_overhead --no-sglang-router"
for i in 1 2 3 4; do  # alternating pairs at concurrency 16
  (cd "$BASE" && $RO --json "$OLDPWD/$R/base-$i.json" > "$OLDPWD/$R/base-$i.txt")
  $RO --json $R/new-$i.json > $R/new-$i.txt
done
for i in 1 2 3; do
  $RO --workers 1 --concurrency 1 --json $R/c1-$i.json > $R/c1-$i.txt
done
python -m sessiongate.benchmarks.instructions --json $R/instructions-after.json > $R/instructions-after.txt
(cd "$BASE" && python -m sessiongate.benchmarks.instructions > "$OLDPWD/$R/instructions-before.txt")
(cd "$BASE" && python -m sessiongate.benchmarks.instructions --stream --systems sessiongate > "$OLDPWD/$R/instructions-streamed-before.txt")
python -m sessiongate.benchmarks.instructions --stream --systems sessiongate stored-floor floor > $R/instructions-streamed-after.txt
for i in 1 2 3; do  # the least store beside the stored floor
  $RO --least-stored-floor --json $R/least-$i.json > $R/least-$i.txt
done
(cd "$BASE" && python -m sessiongate.benchmarks.router_overhead --no-sglang-router --no-floor --concurrency 64 --json "$OLDPWD/$R/c64-base.json" > "$OLDPWD/$R/c64-base.txt")
$RO --no-floor --no-stored-floor --concurrency 64 --json $R/c64-new.json > $R/c64-new.txt
