#!/usr/bin/env bash
# Greedy vs probabilistic draft proposals at T=1 on the real engine, side by side in one run: one
# draft, one policy (the embedded default), the same held-out prompts and output lengths (a harvest's,
# EOS ignored, so every arm decodes the same tokens), plain decoding measured in each sweep. Prints
# acceptance length and speedup per proposal mode and batch size, and the ratio probabilistic/greedy.
# What `--draft-sampling auto` picks on this build rests on this table (docs/results.md).
#   bash benchmarks/draft_sampling.sh DRAFT HARVEST_RUN [OUT_DIR] [K]
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFT=${1:?draft folder}; HARVEST=${2:?harvest run (its output lengths)}; OUT=${3:-runs/draft-sampling}; K=${4:-3}
PY=${PYTHON:-.venv/bin/python}  # python3 on a GPU machine with the bundle
S="$PY -m spectool.cli"
METHOD=$($PY -c "from spectool.families import folder_family; print(folder_family('$DRAFT'))")
for MODE in greedy probabilistic; do
  $S sweep-k --methods "$METHOD" --drafts "$DRAFT" --k "$K" --batch-sizes ${BATCHES:-1,8} --temperature 1 \
    --max-tokens 128 --min-seqs ${MIN_SEQS:-16} --lengths "$HARVEST" --draft-sampling $MODE --out "$OUT/$MODE"
done
$PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = {m: {r["batch"]: r for r in json.loads((out / m / "sweep.json").read_text())["rows"] if r["method"] != "none"}
        for m in ("greedy", "probabilistic")}
print("| batch | proposals | acceptance length | per position | tokens/s | speedup vs plain |")
print("|---|---|---|---|---|---|")
for b in sorted(rows["greedy"]):
    for m in ("greedy", "probabilistic"):
        r = rows[m][b]
        pp = " ".join(f"{x:.2f}" for x in r["per_position"])
        print(f"| {b} | {m} | {r['mean_acceptance_length']:.2f} | {pp} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x |")
for b in sorted(rows["greedy"]):
    g, p = rows["greedy"][b], rows["probabilistic"][b]
    print(f"batch {b}: probabilistic / greedy: acceptance length {p['mean_acceptance_length'] / g['mean_acceptance_length']:.2f}x, "
          f"speedup {p['speedup'] / g['speedup']:.2f}x")
PY
