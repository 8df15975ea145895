#!/bin/bash
# pfl.py's tiny and CNN workloads in two checkouts by turns, for a before/after pair that shares the machine's state:
#   benchmarks/pfl_pairs.sh BEFORE_TREE AFTER_TREE [PAIRS=5]
# Each tree runs its own benchmarks/pfl.py (--engines inline,ray2 --workloads tiny,cnn --repeats 1) with itself on
# PYTHONPATH; logs go to benchmarks/out/pairs-{before,after}-N.log, and the per-round figures are printed at the end.
set -u
before=$(realpath "$1"); after=$(realpath "$2"); pairs=${3:-5}
out=$(dirname "$(realpath "$0")")/out; mkdir -p "$out"
for n in $(seq 1 "$pairs"); do
  for side in before after; do
    tree=$before; [ $side = after ] && tree=$after
    (cd "$tree" && PYTHONPATH="$tree" timeout 900 .venv/bin/python benchmarks/pfl.py --engines inline,ray2 \
      --workloads tiny,cnn --repeats 1 --no-wait --out "pairs-$side-$n" > "$out/pairs-$side-$n.log" 2>&1)
    echo "$side $n rc=$? $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
grep -H "rep 0" "$out"/pairs-*.log
