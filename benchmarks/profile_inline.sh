#!/bin/bash
# cProfile of pfl.py's CNN workload in process, 4 rounds, in the checkout TREE (default: this one):
#   benchmarks/profile_inline.sh [TREE]     -> /tmp/profile-inline.pstats; prints the seconds spent in raysim's own code
set -u
tree=$(realpath "${1:-$(dirname "$(realpath "$0")")/..}"); cd "$tree"
rm -rf /tmp/profile-inline-run
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH="$tree/benchmarks:$tree" .venv/bin/python -m cProfile \
  -o /tmp/profile-inline.pstats -m raysim.cli run name=prof seed=0 rounds=4 clients.num=1000 clients.fraction=0.05 \
  'plugins=[bench_data]' data.name=pfl_images model.name=pfl_cnn model.feature_dim=128 algorithm.name=fedavg \
  train.lr=0.1 train.batch_size=10 train.local_epochs=1 train.momentum=0.0 train.weight_decay=0.0 eval.every=4 \
  engine.cpus_per_worker=1 engine.backend=inline engine.num_workers=1 log.dir=/tmp/profile-inline-run > /dev/null
.venv/bin/python - <<'PY'
import pstats
s = pstats.Stats("/tmp/profile-inline.pstats")
own = sum(v[2] for k, v in s.stats.items() if "/raysim/" in k[0])
print(f"total {s.total_tt:.2f} s, in raysim's own code {own:.3f} s")
PY
