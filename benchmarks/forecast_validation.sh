#!/usr/bin/env bash
# Issue 11's validation: does the cost model, fitted on a WEIGHTLESS sweep of the embedded policy's
# shape with synthetic acceptance, predict the speedups a REAL sweep-k of a real draft measures?
# One run, alone on the machine: (1) real sweep-k of DRAFT, (2) weightless sweep of the same config
# at the real sweep's per-position acceptance, (3) the cost model fitted on (2) predicts (1)'s
# speedup per batch size at (1)'s acceptance; printed side by side with the relative error (bar:
# within 15%). Both sweeps decode MT tokens per sequence (--lengths fixed: EOS ignored), so at T>0
# the plain and speculative arms decode the same number of tokens and no arm ends in a ragged tail.
# Usage: bash benchmarks/forecast_validation.sh DRAFT [OUT] [TEMPERATURE] [MIN_SEQS]
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFT=$1; OUT=${2:-runs/forecast-validation}; T=${3:-0}; N=${4:-32}
S=".venv/bin/spectool"; PY=.venv/bin/python
K=3; B=1,8,32; MT=128
$S sweep-k --draft "$DRAFT" --k $K --batch-sizes $B --temperature $T --max-tokens $MT --lengths fixed \
  --min-seqs $N --out "$OUT/real"
RATES=$($PY -c "import json,sys; s=json.load(open('$OUT/real/sweep.json')); r=[x for x in s['rows'] if x['method']=='eagle3']; print(','.join('%.4f' % (sum(x['per_position'][j] for x in r) / len(r)) for j in range($K)))")
MODEL=$($PY -c "from spectool.models import resolve_model; print(resolve_model('smollm2-135m').path)")
CFG="$OUT/config-only"; mkdir -p "$CFG"; cp "$MODEL/config.json" "$CFG/"
# prompts as long as the real sweep's (its mean context minus half the output)
PL=$($PY -c "import json; r=[x for x in json.load(open('$OUT/real/sweep.json'))['rows'] if x['method']=='none']; print(max(1, round(sum(x['mean_context'] for x in r) / len(r) - $MT / 2)))")
$S sweep-k --model "$CFG" --dummy-weights --acceptance-rates "$RATES" --draft "$DRAFT" --k 1,$K --batch-sizes $B \
  --temperature $T --max-tokens $MT --lengths fixed --prompt-len "$PL" --min-seqs $N --out "$OUT/synthetic"
$PY - "$OUT" "$RATES" $K <<'PY'
import json, sys
from spectool.costmodel import fit
out, rates, k = sys.argv[1], [float(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
syn = json.load(open(f"{out}/synthetic/sweep.json"))["rows"]
real = json.load(open(f"{out}/real/sweep.json"))["rows"]
m = fit([{**r, "k": r["k"] if r["method"] == "eagle3" else 0} for r in syn])
print(f"acceptance per position (measured on the real draft): {rates}; cost-model fit rel. RMSE {m.rel_rmse:.1%}")
print("batch  predicted  measured  rel.error")
for r in (x for x in real if x["method"] == "eagle3" and x["k"] == k):
    ctx = r["mean_context"]
    p = m.speedup(k, r["batch"], rates, ctx)
    print(f"{r['batch']:>5}  {p:9.3f}x {r['speedup']:8.3f}x  {abs(p - r['speedup']) / r['speedup']:8.1%}")
PY
