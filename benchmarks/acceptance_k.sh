#!/usr/bin/env bash
# Acceptance length for k = 1..7 on the real engine (embedded default, held-out prompts, batch 8):
# T=0, T=1 with greedy proposals (vLLM's default), T=1 with proposals sampled from the draft
# (--draft-sampling probabilistic). Three sweep-k runs, then one table side by side.
#   bash benchmarks/acceptance_k.sh DRAFT_DIR [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFT=${1:?usage: acceptance_k.sh DRAFT_DIR [OUT_DIR]}
OUT=${2:-runs/acceptance-k}
S=.venv/bin/spectool
COMMON=(--draft "$DRAFT" --k 1,2,3,4,5,6,7 --batch-sizes 8 --methods eagle3 --max-tokens 128 --min-seqs 32)
$S sweep-k "${COMMON[@]}" --temperature 1 --draft-sampling probabilistic --out "$OUT/t1-sampled"
$S sweep-k "${COMMON[@]}" --temperature 1 --out "$OUT/t1-greedy"
$S sweep-k "${COMMON[@]}" --temperature 0 --out "$OUT/t0"
.venv/bin/python - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
arms = {"T=0": "t0", "T=1 greedy": "t1-greedy", "T=1 sampled": "t1-sampled"}
rows = {name: {r["k"]: r for r in json.loads((out / d / "sweep.json").read_text())["rows"] if r["method"] == "eagle3"}
        for name, d in arms.items()}
print("| k | " + " | ".join(f"{a} acceptance length | {a} speedup" for a in arms) + " |")
print("|---" * (1 + 2 * len(arms)) + "|")
for k in range(1, 8):
    cells = [f"{rows[a][k]['mean_acceptance_length']:.2f} | {rows[a][k]['speedup']:.2f}x" for a in arms]
    print(f"| {k} | " + " | ".join(cells) + " |")
EOF
