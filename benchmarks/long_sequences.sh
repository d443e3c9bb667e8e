#!/usr/bin/env bash
# Reasoning-length sequences (issue 48): a harvest of 1,000+-token completions trains, and a step's memory follows
# --max-batch-tokens, not the sequences' length. Prompts that ask for long answers (benchmarks/data/long_prompts.jsonl),
# 2 samples each of 4 prompts at --max-tokens 1200; then init-draft on them with the whole batch in one forward (the
# default budget, 8192 tokens) and in micro-batches of at most 1024 tokens. Per arm: init-draft's peak RSS
# (/usr/bin/time), its training tokens/s, the mean share of padding in its forwards (metrics.jsonl) and the
# longest training sequence.
# Usage: bash benchmarks/long_sequences.sh [OUT] [EPOCHS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/long}; EPOCHS=${2:-2}
S=".venv/bin/python -m spectool.cli"
[ -f "$OUT/harvest/manifest.json" ] || $S harvest --data benchmarks/data/long_prompts.jsonl --out "$OUT/harvest" \
  --n-prompts 4 --samples 2 --max-tokens 1200 > "$OUT.harvest.log" 2>&1
for budget in 8192 1024; do
  d="$OUT/draft-$budget"
  [ -f "$d/manifest.json" ] || /usr/bin/time -f "%M" -o "$OUT.rss-$budget" $S init-draft --data "$OUT/harvest" \
    --out "$d" --max-batch-tokens "$budget" --epochs "$EPOCHS" --batch-size 4 --save-every 1000 > "$d.log" 2>&1
done
.venv/bin/python - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
print(f"{'max-batch-tokens':>17} {'longest':>8} {'records':>8} {'peak RSS GiB':>13} {'tokens/s':>9} {'padding':>8} {'loss first/last':>16}")
for b in (8192, 1024):
    m = json.load(open(f"{out}/draft-{b}/manifest.json"))["result"]
    lines = [json.loads(x) for x in open(f"{out}/draft-{b}/metrics.jsonl")]
    rss = int(open(f"{out}.rss-{b}").read().split()[-1]) / 1024**2
    print(f"{b:>17} {m['longest_sequence']:>8} {json.load(open(f'{out}/draft-{b}/manifest.json'))['train_records']:>8} "
          f"{rss:>13.2f} {m['train_tokens_per_s']:>9.0f} {statistics.mean(x['padding'] for x in lines):>8.2f} "
          f"{lines[0]['loss']:>7.2f} / {lines[-1]['loss']:.2f}")
PY
