#!/usr/bin/env bash
# The demo pipeline on one GPU, every stage timed: init-draft (demo preset), export,
# rollout --compare at T=0 and T=1, train-rl 10 steps with online refresh, verify at T=1 with greedy
# and probabilistic draft sampling; then the quality preset (target: under 5 min on one GPU) and its
# engine-measured acceptance next to the demo draft's and the oracle's. Prints a table of stage times.
# Usage (GPU machine, bundle installed): . /tmp/site/env.sh && bash benchmarks/gpu_pipeline.sh [OUT]
# ONLY="init-draft export ..." runs those stages (later ones read earlier ones' folders under OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-pipeline}
PY=${PYTHON:-python3}
S="$PY -m spectool.cli"
mkdir -p "$OUT"
LOG="$OUT/times.tsv"; touch "$LOG"
stage() {  # stage NAME CMD...: run, time, keep the output (only the stages named in $ONLY, if set)
  local name=$1; shift
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then return; fi
  local t0=$(date +%s%N)  # nanoseconds: bash arithmetic (the GPU image has no bc)
  "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"; local rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  printf '%s\t%d.%d\t%s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) "$rc" | tee -a "$LOG"
}
stage init-draft $S init-draft --out "$OUT/draft" --n-prompts 192 --samples 4 --max-tokens 128 --epochs 3
stage export $S export --draft "$OUT/draft" --out "$OUT/export" --k 3
stage rollout-t0 $S rollout --draft "$OUT/export" --k 3 --compare --temperature 0 --n-prompts 32 --max-tokens 128
stage rollout-t1 $S rollout --draft "$OUT/export" --k 3 --compare --temperature 1 --n-prompts 32 --max-tokens 128
stage train-rl $S train-rl --config templates/rl.yaml --set out="$OUT/rl" --set speculation.draft="$OUT/draft" \
  --set policy.steps=10 --set policy.lr=1e-5 --set policy.logprob_check_every=1 --set rollout.prompts_per_step=8 \
  --set rollout.group_size=4 --set rollout.max_tokens=96 --set rollout.eval_every=5 --set draft_refresh.every=2 \
  --set draft_refresh.steps_per_refresh=10 --set draft_refresh.ttt_steps=3
stage verify-greedy $S verify --draft "$OUT/export" --k 3 --out "$OUT/verify-greedy"
stage verify-probabilistic $S verify --draft "$OUT/export" --k 3 --draft-sampling probabilistic --out "$OUT/verify-prob"
stage init-draft-quality $S init-draft --preset quality --out "$OUT/quality"
stage draft-quality $PY benchmarks/draft_quality.py --new "$OUT/quality" --base "$OUT/draft" --out "$OUT/draft-quality"
echo
echo "stage seconds (name, wall s, exit code):"; cat "$LOG"
tail -5 "$OUT/draft-quality.out" 2>/dev/null
echo
for t in t0 t1; do echo "rollout $t:"; grep -E "speedup|throughput|plain decoding|mean acceptance" "$OUT/rollout-$t.out" 2>/dev/null; done
if [[ -f "$OUT/rl/metrics.jsonl" ]]; then
echo "train-rl logprob checks (mean / max |engine - trainer| per checked step):"
$PY - "$OUT/rl/metrics.jsonl" <<'PY'
import json, sys
m = [json.loads(x) for x in open(sys.argv[1])]
print(" ".join(f"{r['logprob_check_mean_diff']:.3g}/{r['logprob_check_max_diff']:.3g}" for r in m
               if "logprob_check_mean_diff" in r), f"({len(m)} steps)")
print("mean acceptance length", sum(r.get("acceptance_length", 0) for r in m) / len(m))
PY
fi
grep -h "verdict\|LOSSLESS" "$OUT"/verify-*.out 2>/dev/null | head -4
