#!/usr/bin/env bash
# Drafter families side by side on the embedded default (SmolLM2-135M-Instruct, the default task):
# one harvest with hidden states, then an EAGLE-3, a P-EAGLE and a DFlash draft trained on it with the
# same budget (same records, epochs, batch, block/unroll of 7 positions), then one sweep-k per
# temperature over every family at k = 3, 5, 7 on the held-out prompts, plain decoding measured in
# the same sweep. Prints acceptance length, per-position acceptance and speedup per (family, k).
#   bash benchmarks/parallel_drafters.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/parallel-drafters}
S=.venv/bin/spectool
$S harvest --out "$OUT/harvest" --n-prompts ${N_PROMPTS:-128} --samples 4 --max-tokens 128 --hidden-states --split train
TRAIN=(--data "$OUT/harvest" --ttt-steps 7 --epochs ${EPOCHS:-2} --batch-size 4)
for F in eagle3 peagle dflash; do
  /usr/bin/time -f "$F init-draft wall %e s" $S init-draft --method $F --out "$OUT/$F" "${TRAIN[@]}" 2>&1 | tail -n 25
done
SWEEP=(--methods eagle3,peagle,dflash --drafts "$OUT/eagle3,$OUT/peagle,$OUT/dflash" --k 3,5,7 --batch-sizes ${BATCHES:-1,8}
       --max-tokens 128 --min-seqs ${MIN_SEQS:-16})
$S sweep-k "${SWEEP[@]}" --temperature 0 --out "$OUT/sweep-t0"
$S sweep-k "${SWEEP[@]}" --temperature 1 --out "$OUT/sweep-t1"
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print("| T | batch | family | k | acceptance length | per position | speedup vs plain | ceiling |")
print("|---|---|---|---|---|---|---|---|")
for t in ("t0", "t1"):
    s = json.loads((out / f"sweep-{t}" / "sweep.json").read_text())
    for r in s["rows"]:
        if r["method"] == "none":
            continue
        pp = " ".join(f"{x:.2f}" for x in r["per_position"])
        print(f"| {t[1]} | {r['batch']} | {r['method']} | {r['k']} | {r['mean_acceptance_length']:.2f} | {pp} | "
              f"{r['speedup']:.2f}x | {r['ceiling']:.2f}x |")
    for b, v in s["recommendation"].items():
        print(f"T={t[1]} batch {b}: recommended {v['method']} k={v.get('k')}")
PY
