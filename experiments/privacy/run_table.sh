#!/usr/bin/env bash
# The DP-FedAvg table of docs/reference.md (*Differential privacy*): dpfedavg-mnist500.yaml at target ε 1, 4, 8 and
# without privacy (ε = ∞), seeds 0-2, then the table (mean ± std of the final accuracy, the accountant's ε).
# Usage: experiments/privacy/run_table.sh [OUT_DIR [OVERRIDE ...]] (default runs/privacy-table); PYTHON overrides the
# interpreter, EPSILONS the targets ("1 4 8 inf"). The Poisson rows: run_table.sh runs/privacy-poisson
# privacy.sampling=poisson (with EPSILONS="1 4 8": ∞ is the same run either way).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-runs/privacy-table}"
shift || true
py="${PYTHON:-python}"
epsilons="${EPSILONS:-1 4 8 inf}"
for seed in 0 1 2; do
  for eps in $epsilons; do
    dir="$out/eps$eps-seed$seed"
    [ -f "$dir/metrics.jsonl" ] && [ "$(wc -l < "$dir/metrics.jsonl")" -ge 30 ] && continue
    if [ "$eps" = inf ]; then extra=(privacy.enabled=false); else extra=(privacy.target_epsilon="$eps"); fi
    "$py" -m raysim run "$here/dpfedavg-mnist500.yaml" seed="$seed" "${extra[@]}" log.dir="$dir" log.progress=false \
      "$@" > /dev/null
  done
done
"$py" - "$out" $epsilons <<'PY'
import json, sys
from pathlib import Path
import numpy as np
out = Path(sys.argv[1])
print("| target ε | σ (noise multiplier) | ε from the accountant (δ = 1/500) | final accuracy (3 seeds) |")
print("| --- | --- | --- | --- |")
for eps in sys.argv[2:]:
    rows = [[json.loads(l) for l in (out / f"eps{eps}-seed{s}" / "metrics.jsonl").read_text().splitlines()]
            for s in range(3)]
    acc = np.array([r[-1]["acc_global"] for r in rows])
    spent = [r[-1].get("epsilon") for r in rows]
    z = rows[0][-1].get("privacy/noise_multiplier")
    print(f"| {'∞' if eps == 'inf' else eps} | {'-' if z is None else f'{z:.3f}'} | "
          f"{'∞' if spent[0] is None else f'{spent[0]:.3f}'} | {acc.mean():.3f} ± {acc.std(ddof=1):.3f} |")
PY
