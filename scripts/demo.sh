#!/usr/bin/env bash
# The main job on the embedded default (SmolLM2-135M-Instruct policy, offline gym math):
# harvest -> init-draft -> export (verified on vLLM) -> speculative rollout vs plain decoding -> train-rl.
# Idempotent: a second run resumes/reuses the harvest, the draft checkpoint and the model cache.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
S=.venv/bin/spectool
RUN=${SPECTOOL_DEMO_DIR:-runs/demo}
$S init-draft --out "$RUN/draft" --n-prompts 192 --samples 4 --max-tokens 128 --epochs 3
$S export --draft "$RUN/draft" --out "$RUN/export" --k 3
# The task's held-out split holds 13 prompts: all of them, greedy once at T=0 and 8 samples each at T=1
# (104 completions), so the T=1 comparison rests on more than 13 short answers. Each --compare says "won", "lost" or
# "no difference beyond the noise" from its timed passes' spread, and flags a busy machine or a measurement fault.
$S rollout --draft "$RUN/export" --k 3 --compare --temperature 0 --n-prompts 13 --max-tokens 128 --out "$RUN/rollout-t0"
$S rollout --draft "$RUN/export" --k 3 --compare --temperature 1 --n-prompts 13 --samples 8 --max-tokens 128 \
  --out "$RUN/rollout-t1"
# Where speculation pays on this machine, beyond noise: T=1 (what RL samples at) at batch 1 and 4, k = 2 and 3, each
# speedup with its lower bound over 3 rounds of fresh engines (the noise between engine runs counted, every arm
# counted); a recommendation only where the bound clears the margin, else the reason.
# Completions end at EOS as in RL, and the draft samples its proposals: at batch 1 that measured 1.04-1.16x in three
# sweeps (docs/results.md, "Draft proposals"), the one place speculation paid at T=1 on 2 cores.
$S sweep-k --draft "$RUN/draft" --k 2,3 --batch-sizes 1,4 --temperature 1 --draft-sampling probabilistic \
  --out "$RUN/sweep-t1"
# Online GRPO with speculative rollouts and the draft refreshed from the trainer's own forward.
$S train-rl --config templates/rl.yaml --set out="$RUN/rl" --set speculation.draft="$RUN/draft" \
  --set policy.steps=6 --set policy.lr=1e-5 --set rollout.prompts_per_step=8 --set rollout.group_size=4 \
  --set rollout.max_tokens=96 --set rollout.eval_every=3 --set draft_refresh.every=2 \
  --set draft_refresh.steps_per_refresh=10 --set draft_refresh.ttt_steps=3
