#!/usr/bin/env bash
# harvest with one engine, then with N data-parallel replicas (one per process, torchrun), the same
# prompts and settings, one after the other; prints each run's wall time and generated tokens/s and
# the ratio. On a 2-core CPU two replicas share the cores one engine had: this measures the plumbing.
#   bash benchmarks/harvest_replicas.sh [MODEL] [N_PROMPTS] [REPLICAS]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-smollm2-135m}; prompts=${2:-32}; replicas=${3:-2}
data="gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
out=$(mktemp -d /tmp/harvest_replicas-XXXX)
export SPECTOOL_ENFORCE_EAGER=1
common=(--model "$model" --data "$data" --n-prompts "$prompts" --samples 2 --max-tokens 64)
t0=$(date +%s.%N)
.venv/bin/python -m spectool.cli harvest "${common[@]}" --out "$out/one" | tee "$out/one.txt"
t1=$(date +%s.%N)
.venv/bin/python -m torch.distributed.run --nproc_per_node "$replicas" -m spectool.cli harvest "${common[@]}" \
  --out "$out/dp" --data-parallel-size "$replicas" | tee "$out/dp.txt"
t2=$(date +%s.%N)
rate() { grep -o '[0-9.]* generated tokens/s' "$1" | cut -d' ' -f1; }
python3 - "$(rate "$out/one.txt")" "$(rate "$out/dp.txt")" "$t0" "$t1" "$t2" "$replicas" "$(nproc)" <<'PY'
import sys
one, dp, t0, t1, t2 = map(float, sys.argv[1:6])
print(f"harvest, {sys.argv[7]} cores: 1 engine {one:.1f} tok/s ({t1 - t0:.0f} s wall with start-up); "
      f"{sys.argv[6]} replicas {dp:.1f} tok/s ({t2 - t1:.0f} s wall): {dp / one:.2f}x tokens/s")
PY
