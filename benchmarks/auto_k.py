"""`rollout --k auto` vs the best fixed k vs plain decoding on an RL-shaped rollout: many prompts x
several samples at temperature 1, all submitted at once, so the live batch starts large and ends in
a long tail of a few long sequences. Side by side in one run, each arm on its own engine/process.

    .venv/bin/python benchmarks/auto_k.py --sweep runs/sweep [--n-prompts 32 --samples 4]

The schedule and the best fixed k come from the sweep-k run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rl_rollout(model_path: str, draft: str | None, k: int, k_schedule, prompts: list[list[int]], samples: int,
               max_tokens: int, seed: int) -> dict:
    """One arm: every prompt x `samples` submitted together (the RL rollout shape)."""
    from spectool.engine.engine import Engine, EngineConfig, Sampling

    engine = Engine(EngineConfig(model_path=model_path, draft_path=draft, k=max(k, 1), seed=seed,
                                 k_schedule=[tuple(x) for x in k_schedule] if k_schedule else None))
    engine.generate(prompts[:4], Sampling(n=2, max_tokens=8))  # warm-up
    t0 = time.perf_counter()
    outs, st = engine.generate(prompts, Sampling(n=samples, max_tokens=max_tokens, temperature=1.0, seed=seed))
    secs = time.perf_counter() - t0
    lens = [len(c.response_ids) for per in outs for c in per]
    return {"tokens": sum(lens), "seconds": secs, "tokens_per_s": sum(lens) / secs, "max_len": max(lens),
            "mean_len": sum(lens) / len(lens),
            "mean_acceptance_length": st.mean_acceptance_length if st.num_drafts else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", required=True, help="sweep-k run directory")
    ap.add_argument("--n-prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from spectool import subproc
    from spectool.data import load_source
    from spectool.models import resolve_model
    from spectool.prompts import encode_prompt
    from spectool.runs import read_json

    sweep = read_json(Path(a.sweep) / "sweep.json")
    cfg = read_json(Path(a.sweep) / "config.json")
    model = resolve_model(cfg["model"])
    tok = AutoTokenizer.from_pretrained(model.path)
    prompts = [encode_prompt(tok, t.messages) for t in load_source(cfg["data"], seed=a.seed).tasks("eval", a.n_prompts)]
    eagle = [r for r in sweep["rows"] if r["method"] == "eagle3"]
    by_k: dict[int, list[float]] = {}
    for r in eagle:
        by_k.setdefault(r["k"], []).append(r["speedup"])
    best_k = max(by_k, key=lambda k: sum(by_k[k]) / len(by_k[k]))  # best fixed k over the swept batch sizes
    arms = {"plain": (None, 0, None), f"fixed k={best_k}": (sweep["draft"], best_k, None),
            "auto": (sweep["draft"], 0, sweep["eagle3_schedule"])}
    os.chdir(ROOT)
    res = {}
    for name, (draft, k, sched) in arms.items():
        print(f"running {name} ...", file=sys.stderr)
        res[name] = subproc.call("benchmarks.auto_k", "rl_rollout", dict(
            model_path=model.path, draft=draft, k=k, k_schedule=sched, prompts=prompts, samples=a.samples,
            max_tokens=a.max_tokens, seed=a.seed))
    print(f"RL-shaped rollout: {len(prompts)} prompts x {a.samples} samples, T=1, max {a.max_tokens} tokens; "
          f"schedule {sweep['eagle3_schedule']}")
    base = res["plain"]["tokens_per_s"]
    print(f"{'arm':>12} {'tokens/s':>9} {'vs plain':>9} {'accept. len':>11} {'mean len':>9}")
    for name, r in res.items():
        al = r["mean_acceptance_length"]
        print(f"{name:>12} {r['tokens_per_s']:>9.1f} {r['tokens_per_s'] / base:>8.2f}x "
              f"{(f'{al:.2f}' if al else '-'):>11} {r['mean_len']:>9.1f}")
    print(json.dumps(res))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1].endswith(".json"):
        from spectool import subproc

        subproc.serve(globals())
    else:
        main()
