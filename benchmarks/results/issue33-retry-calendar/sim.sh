#!/bin/bash
# The queue alone (benchmarks/admission_sim.py), before (07fc557, its export in /tmp/g-before with this module copied
# in) and after (this tree); run from the repository root.
for args in "" "--jitter 0.5 --late 0.3 --swing 0.3"; do
  for seed in 0 1 2; do
    echo "== after $args --seed $seed"; python -m sessiongate.benchmarks.admission_sim $args --seed $seed
  done
  cp sessiongate/benchmarks/admission_sim.py /tmp/g-before/sessiongate/benchmarks/
  echo "== before $args"; (cd /tmp/g-before && python -m sessiongate.benchmarks.admission_sim $args)
  rm /tmp/g-before/sessiongate/benchmarks/admission_sim.py
done
