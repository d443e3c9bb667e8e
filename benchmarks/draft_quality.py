"""Issue 12's bars, measured on the real engine: the acceptance of a new draft next to the current
recipe's and next to the oracle ceiling, on held-out in-domain prompts, k=3.

Every cell is one `spectool rollout` on the same held-out prompts (the default task's eval split,
never harvested for training) with the same seeds, reading the engine's own acceptance counters:
  - T=0 (greedy proposals), T=1 greedy proposals, T=1 probabilistic proposals, per draft;
  - the oracle: `--draft-model policy`, the policy proposing its own argmax. At T=1 with greedy
    proposals no draft can be accepted more often; a probabilistic draft's ceiling is k+1 (q = p),
    and at T=0 the oracle's is k+1 too.
Then, for every greedy cell, the acceptance length init-draft's report predicts for it
(`loss.greedy_walk` over the cell's own records, policy features recomputed by transformers), next
to the engine's: the check that the report's T=1 greedy figure is the engine's.

    .venv/bin/python benchmarks/draft_quality.py --new runs/quality/draft --base runs/demo/draft
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from spectool.stats import AcceptanceStats

ROOT = Path(__file__).resolve().parents[1]
SPECTOOL = [sys.executable, "-m", "spectool.cli"]
MODES = (("T=0", 0.0, "greedy"), ("T=1 greedy", 1.0, "greedy"), ("T=1 probabilistic", 1.0, "probabilistic"))
BARS = {"T=0": 3.3, "T=1 greedy": 1.75, "T=1 probabilistic": 2.3}  # the quality targets, k=3


def measure(out: Path, draft_args: list[str], temperature: float, draft_sampling: str, a) -> AcceptanceStats:
    """One rollout's acceptance (reused when `out` holds a finished one)."""
    if not (out / "manifest.json").exists():
        args = ["rollout", *draft_args, "--k", str(a.k), "--split", "eval", "--temperature", str(temperature),
                "--draft-sampling", draft_sampling, "--n-prompts", str(a.n_prompts),
                "--samples", str(a.samples if temperature > 0 else 1), "--max-tokens", str(a.max_tokens),
                "--out", str(out)]
        print("$ spectool " + " ".join(args), file=sys.stderr, flush=True)
        subprocess.run([*SPECTOOL, *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return AcceptanceStats(**json.loads((out / "manifest.json").read_text())["summary"]["acceptance"])


def walked(policy, cell: Path, draft: str, k: int) -> dict[str, float]:
    """init-draft's walk over the records of one rollout: {"draft": AL, "oracle": AL} at k."""
    from spectool.draft.checkpoint import load_draft
    from spectool.draft.ttt import heldout_metrics
    from spectool.draft.vocab import ids_from_d2t
    from spectool.hidden import feature_items
    from spectool.records import load_records

    d, _ = load_draft(Path(draft), policy)
    recs = load_records(cell)
    prompt_lens = [len(p) for p in recs["prompt_ids"]]
    items = feature_items(policy, [p + r for p, r in zip(recs["prompt_ids"], recs["response_ids"])],
                          d.config.aux_layer_ids)
    m = heldout_metrics(d, items, prompt_lens, policy.get_output_embeddings().weight, ids_from_d2t(d.d2t), k, 8, "cpu")
    return {"draft": m["walk_greedy"][k - 1], "oracle": m["walk_oracle"][k - 1]}


def _cell(out: str, arm: str, draft_args: list[str], mode: str) -> Path:
    """One cell's rollout folder, named by a hash of the draft folder: a rerun with another --new
    measures it, and reuses the rest."""
    import hashlib

    tag = hashlib.sha256(str(Path(draft_args[1]).resolve()).encode()).hexdigest()[:8]
    return Path(out) / f"{arm}-{tag}-{mode.replace(' ', '-').replace('=', '')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new", required=True, help="the new draft folder")
    ap.add_argument("--base", required=True, help="a draft of the current recipe")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--n-prompts", type=int, default=32, help="held-out prompts (the eval split has about 20)")
    ap.add_argument("--samples", type=int, default=4, help="completions per prompt at T=1")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="runs/draft-quality")
    a = ap.parse_args()

    arms = {"new": ["--draft", a.new], "base": ["--draft", a.base], "oracle": ["--draft-model", "policy"]}
    table: dict[str, dict[str, AcceptanceStats]] = {}
    for arm, draft_args in arms.items():
        for mode, temperature, sampling in MODES:
            if arm == "oracle" and sampling == "probabilistic":
                continue  # q = p: every proposal is accepted, k + 1 by construction
            table.setdefault(arm, {})[mode] = measure(_cell(a.out, arm, draft_args, mode), draft_args, temperature,
                                                      sampling, a)
    result = {arm: {mode: {"acceptance_length": s.mean_acceptance_length, "per_position": s.per_position_rate,
                           "drafts": s.num_drafts} for mode, s in row.items()} for arm, row in table.items()}
    (Path(a.out) / "summary.json").write_text(json.dumps({"new": a.new, "base": a.base, "k": a.k, **result}, indent=2))

    print(f"engine-measured acceptance length, k={a.k}, held-out in-domain prompts (per-position acceptance)")
    print(f"{'':8}" + "".join(f"{m:>30}" for m, _, _ in MODES))
    for arm in arms:
        cells = []
        for mode, _, _ in MODES:
            s = table[arm].get(mode)
            cells.append(f"{s.mean_acceptance_length:.2f} ({' '.join(f'{x:.2f}' for x in s.per_position_rate)})"
                         if s else f"{a.k + 1:.2f} (q = p)")
        print(f"{arm:8}" + "".join(f"{c:>30}" for c in cells))
    print(f"{'bar':8}" + "".join(f"{'>= ' + str(BARS[m]):>30}" for m, _, _ in MODES))

    print("\ninit-draft's walk over each greedy cell's own records vs the engine on them (acceptance length)")
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from spectool.models import resolve_model

    logging.disable_progress_bar()
    policy = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m").path, dtype=torch.float32)
    for arm, draft_args in arms.items():
        for mode, _, sampling in MODES:
            if sampling != "greedy":
                continue
            w = walked(policy, _cell(a.out, arm, draft_args, mode), a.new if arm == "oracle" else draft_args[1], a.k)
            pred = w["oracle" if arm == "oracle" else "draft"]
            print(f"{arm:8}{mode:>12}: walk {pred:.2f}, engine {table[arm][mode].mean_acceptance_length:.2f}")


if __name__ == "__main__":
    main()
