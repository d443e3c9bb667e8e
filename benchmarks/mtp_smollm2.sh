#!/usr/bin/env bash
# The MTP path on a real model: SmolLM2-135M served as MiMo (benchmarks/mtp_equivalence.py checks it
# is still SmolLM2), its MTP layer fine-tuned in-domain by `init-draft --method mtp` with the demo
# draft's data and settings, then sweep-k side by side with the demo's EAGLE-3 draft on the same
# held-out prompts: k = 1..3 at T=0 and T=1 (greedy proposals), batch 8. Prints the four tables.
#   bash benchmarks/mtp_smollm2.sh                      # needs runs/demo/export (README first block)
#   FIXED=1 bash benchmarks/mtp_smollm2.sh              # also: 128 tokens per sequence, EOS ignored
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/mtp}
EAGLE=${EAGLE:-runs/demo/export}
export SPECTOOL_ENFORCE_EAGER=${SPECTOOL_ENFORCE_EAGER:-1}  # engine starts in seconds; both arms alike
$PY benchmarks/mtp_equivalence.py --out "$OUT/smollm2-mimo" | tail -1
$PY -m spectool.cli init-draft --method mtp --model "$OUT/smollm2-mimo" --out "$OUT/smollm2-mtp" \
    --n-prompts 192 --samples 4 --max-tokens 128 --epochs 3 --ttt-steps 3
LEN=()
[ "${FIXED:-0}" = 1 ] && LEN=(--lengths fixed --max-tokens 128)
for T in 0 1; do
  $PY -m spectool.cli sweep-k --model smollm2-135m --draft "$EAGLE" --methods eagle3 --k 1,2,3 --batch-sizes 8 \
      --min-seqs 16 --temperature $T "${LEN[@]}" --out "$OUT/sweep${FIXED:+128}-eagle3-T$T"
  $PY -m spectool.cli sweep-k --model "$OUT/smollm2-mtp" --methods mtp --k 1,2,3 --batch-sizes 8 \
      --min-seqs 16 --temperature $T "${LEN[@]}" --out "$OUT/sweep${FIXED:+128}-mtp-T$T"
done
