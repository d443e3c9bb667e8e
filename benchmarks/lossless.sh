#!/usr/bin/env bash
# spectool verify on the embedded default: plain vs speculative decoding, and the lossy controls that show the tests'
# power (default: the unpatched CPU rejection sampler), T=1. How often the verdict is right, from high entropy to a
# near-deterministic policy: benchmarks/verify_calibration.py.
#   bash benchmarks/lossless.sh DRAFT_DIR [OUT_DIR] [greedy|probabilistic] [CONTROLS]
#   CONTROLS: auto (default) or e.g. unpatched,offbyone,truncated,temperature
set -euo pipefail
cd "$(dirname "$0")/.."
DRAFT=${1:?usage: lossless.sh DRAFT_DIR [OUT_DIR] [greedy|probabilistic] [CONTROLS]}
OUT=${2:-runs/verify-default}
.venv/bin/spectool verify --draft "$DRAFT" --out "$OUT" --k 3 --n-prompts 4 --samples 300 --positions 6 \
  --draft-sampling "${3:-greedy}" --control "${4:-auto}"
