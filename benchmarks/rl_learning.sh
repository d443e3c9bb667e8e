#!/usr/bin/env bash
# Does the policy learn? A train-rl run without speculation (fastest here) on the embedded default,
# with a sampled held-out eval (13 held-out prompts x 8 samples at T=1, the same seeds at every
# eval) every 5 steps; prints the eval curve. Usage: bash benchmarks/rl_learning.sh [OUT] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/rl-learn}
STEPS=${2:-20}
.venv/bin/spectool train-rl --set out="$OUT" --set speculation.enabled=false --set policy.steps="$STEPS" \
  --set policy.lr=3e-5 --set rollout.prompts_per_step=8 --set rollout.group_size=4 --set rollout.max_tokens=96 \
  --set rollout.eval_every=5 --set rollout.eval_samples=8 --set checkpoint_every=5
.venv/bin/python - "$OUT" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
for r in rows:
    if "eval_reward" in r:
        train = [x["reward"] for x in rows if r["step"] - 5 < x["step"] <= r["step"]]
        print(f"step {r['step']:>3}: held-out reward {r['eval_reward']:.3f}   train reward (last 5 steps) {sum(train) / len(train):.3f}")
PY
