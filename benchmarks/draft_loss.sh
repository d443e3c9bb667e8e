#!/usr/bin/env bash
# Which per-position loss trains the better draft for T=1 speculation? One harvest, the same cached policy
# features, the same steps (so about the same wall time: each arm's training seconds are printed); --loss ce | tv |
# mix | tv-heavy (the field's 0.1 CE + 0.9 TV) side by side on held-out prompts: the offline metrics (top-1,
# P(accept) of a greedy and of a sampling draft), the acceptance lengths at k=3 they imply, and init-draft's own
# report at k = its --ttt-steps (T=0, T=1 greedy walked, T=1 probabilistic; offline too: the engine's figures come
# from benchmarks/draft_quality.py). LOSSES="..." picks the arms; ARMS adds others, "name:init-draft flags"
# separated by ";" (the draft's size: ARMS="layers2:--draft-layers 2;vocab16k:--draft-vocab-size 16384"; the
# position weights: ARMS="rejection:--position-weights rejection;reach:--position-weights reach"); an arm's flags
# follow the default loss unless they name one.
# FEATURES_CACHE (the .train/features.safetensors of an init-draft --features cache run on that harvest) becomes the harvest's
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
LOSSES=${LOSSES-ce tv mix tv-heavy}
NAMES=""
IFS=';' read -ra EXTRA <<< "${ARMS:-}"
for arm in $LOSSES "${EXTRA[@]}"; do
  case "$arm" in *:*) name=${arm%%:*}; flags=${arm#*:} ;; *) name=$arm; flags="--loss $arm" ;; esac
  NAMES="$NAMES $name"
  # shellcheck disable=SC2086  # the arm's flags are words
  [ -f "$OUT/$name/manifest.json" ] || .venv/bin/spectool init-draft --data "$H" --out "$OUT/$name" $flags --epochs "$EPOCHS" > "$OUT/$name.out" 2>&1
done
LOSSES="$NAMES" .venv/bin/python - "$OUT" <<'PY'
import json, math, os, sys
out = sys.argv[1]
def chain(r): return 1 + sum(math.prod(r[:i + 1]) for i in range(len(r)))
print("arm       train s  top-1 (pos 1-3)     P(acc) greedy       P(acc) sampling     offline AL k=3: T=0 / T=1 greedy (walked) "
      "/ T=1 sampling   init-draft's AL at k=ttt_steps: T=0 / T=1 greedy / T=1 probabilistic")
for loss in os.environ["LOSSES"].split():
    m = json.load(open(f"{out}/{loss}/manifest.json"))
    r, e = m["result"], m.get("acceptance_lengths", {}).get("heldout", {})
    t, g, s = (r["heldout"][k][:3] for k in ("top1", "p_accept", "p_accept_sampled"))
    walk = r["heldout"]["walk_greedy"][2] if "walk_greedy" in r["heldout"] else chain(g)  # runs before the walk: chained
    f = lambda xs: " ".join(f"{x:.3f}" for x in xs)
    eng = " / ".join(f"{e[k]:.2f}" if k in e else "-" for k in ("T=0", "T=1 greedy", "T=1 probabilistic"))
    print(f"{loss:8}  {r['seconds']:7.0f}  {f(t):18}  {f(g):18}  {f(s):18}  {chain(t):.2f} / {walk:.2f} / {chain(s):.2f}"
          f"{'':17}{eng}")
PY
