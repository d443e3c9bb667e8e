#!/usr/bin/env bash
# spectool verify on the embedded default: plain vs speculative vs the unpatched CPU sampler, T=1.
#   bash benchmarks/lossless.sh DRAFT_DIR [OUT_DIR] [greedy|probabilistic]
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFT=${1:?usage: lossless.sh DRAFT_DIR [OUT_DIR] [greedy|probabilistic]}
OUT=${2:-runs/verify-default}
.venv/bin/spectool verify --draft "$DRAFT" --out "$OUT" --k 3 --n-prompts 4 --samples 300 --positions 6 \
  --draft-sampling "${3:-greedy}"
