#!/usr/bin/env bash
# The DP-FedAvg table of docs/reference.md (*Differential privacy*) and the README: dpfedavg-mnist500.yaml at target
# ε 1, 4, 8 and without privacy (ε = ∞), seeds 0-2, then the table (mean ± std of the final accuracy, the accountant's
# ε, and the audit's empirical estimate, audit/epsilon, from the config's 1,000 canaries).
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
rows = {eps: [[json.loads(l) for l in (out / f"eps{eps}-seed{s}" / "metrics.jsonl").read_text().splitlines()]
              for s in range(3)] for eps in sys.argv[2:]}
delta = next((r[-1]["privacy/delta"] for runs in rows.values() for r in runs if "privacy/delta" in r[-1]), None)
print(f"| target ε | σ (noise multiplier) | ε from the accountant (δ = {delta:.2g}) | audit/epsilon (3 seeds) "
      f"| final accuracy (3 seeds) |")
print("| --- | --- | --- | --- | --- |")
for eps, runs in rows.items():
    acc = np.array([r[-1]["acc_global"] for r in runs])
    spent = [r[-1].get("epsilon") for r in runs]
    audit = np.array([r[-1]["audit/epsilon"] for r in runs if "audit/epsilon" in r[-1]])
    z = runs[0][-1].get("privacy/noise_multiplier")
    print(f"| {'∞' if eps == 'inf' else eps} | {'-' if z is None else f'{z:.3f}'} | "
          f"{'∞' if spent[0] is None else f'{spent[0]:.3f}'} | "
          f"{f'{audit.mean():.2f} ± {audit.std(ddof=1):.2f}' if len(audit) == 3 else '-'} | "
          f"{acc.mean():.3f} ± {acc.std(ddof=1):.3f} |")
PY
