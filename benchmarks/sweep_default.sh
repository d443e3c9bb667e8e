#!/usr/bin/env bash
# The sweep-k table for the embedded default: SmolLM2-135M + gym chain_sum, held-out prompts, T=1.
#   bash benchmarks/sweep_default.sh DRAFT_DIR [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFT=${1:?usage: sweep_default.sh DRAFT_DIR [OUT_DIR]}
OUT=${2:-runs/sweep-default}
.venv/bin/spectool sweep-k --draft "$DRAFT" --out "$OUT" --k 1,2,3,4,5 --batch-sizes 1,8,32 \
  --methods eagle3,ngram --max-tokens 128 --temperature 1.0 --min-seqs 8
