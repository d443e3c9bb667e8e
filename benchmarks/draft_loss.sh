#!/usr/bin/env bash
# Issue 12: which per-position loss trains the better draft for T=1 speculation? One harvest, the
# same cached policy features, the same steps; --loss ce | tv | mix side by side on held-out
# prompts (top-1, P(accept) of a greedy and of a sampling draft, expected acceptance length).
# FEATURES_CACHE (an init-draft .train/features.safetensors of that harvest) becomes the harvest's
# hidden-state shard, so no run recomputes the policy's features.
# Usage: bash benchmarks/draft_loss.sh HARVEST_RUN [FEATURES_CACHE] [OUT] [EPOCHS]
set -euo pipefail
cd "$(dirname "$0")/.."
H=$1; CACHE=${2:-}; OUT=${3:-runs/draft-loss}; EPOCHS=${4:-3}
mkdir -p "$OUT"
if [ -n "$CACHE" ] && [ ! -d "$OUT/harvest" ]; then
  cp -r "$H" "$OUT/harvest" && mkdir -p "$OUT/harvest/hidden" && cp "$CACHE" "$OUT/harvest/hidden/shard-00000.safetensors"
  .venv/bin/python - "$OUT/harvest" <<'PY'
import json, sys
from transformers import AutoConfig
from spectool.hidden import default_aux_layer_ids
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
m["aux_layer_ids"] = default_aux_layer_ids(AutoConfig.from_pretrained(m["model_path"]).num_hidden_layers)
json.dump(m, open(f"{sys.argv[1]}/manifest.json", "w"), indent=2)
PY
fi
[ -d "$OUT/harvest" ] && H="$OUT/harvest"
for loss in ce tv mix; do
  .venv/bin/spectool init-draft --data "$H" --out "$OUT/$loss" --loss "$loss" --epochs "$EPOCHS" > "$OUT/$loss.out" 2>&1
done
.venv/bin/python - "$OUT" <<'PY'
import json, math, sys
out = sys.argv[1]
def chain(r): return 1 + sum(math.prod(r[:i + 1]) for i in range(len(r)))
print("loss  top-1 (pos 1-3)      P(acc) greedy       P(acc) sampling     AL k=3: T=0 / T=1 greedy (walked) / T=1 sampling")
for loss in ("ce", "tv", "mix"):
    r = json.load(open(f"{out}/{loss}/manifest.json"))["result"]
    t, g, s = (r["heldout"][k][:3] for k in ("top1", "p_accept", "p_accept_sampled"))
    walk = r["heldout"]["walk_greedy"][2] if "walk_greedy" in r["heldout"] else chain(g)  # runs before the walk: chained
    f = lambda xs: " ".join(f"{x:.3f}" for x in xs)
    print(f"{loss:4}  {f(t):18}  {f(g):18}  {f(s):18}  {chain(t):.2f} / {walk:.2f} / {chain(s):.2f}")
PY
