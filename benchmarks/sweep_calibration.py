"""sweep-k's decision, calibrated on the real engine: how often it recommends a gain that is not there (A/A), and
how often it finds one that is (power), at its default budget.

  collect: engine runs one after the other, each a fresh engine in its own process (sweep-k's own
           `engine.arms.measure_arm`), the labels of --pattern in turn (e.g. plain,draft: plain decoding, then the
           draft at --k), each run's rows appended to POOL/pool.jsonl as it ends (a killed collection resumes).
           Every run of a label decodes the same prompts with the same seed, so two runs differ by the machine alone.
  analyse: sweeps made of consecutive runs of the pool, as sweep-k would have measured them (rounds of engines in
           time order, the order reversed every other round), decided by sweep-k's own `stats.sweep_speedups` and
           `stats.recommend`:
           - A/A: every engine of the sweep a run of ONE label (plain against plain; the draft against itself),
             ARMS arms beside the baseline; a false alarm = any arm recommended at that batch size;
           - power: the baseline a plain run, the arm a draft run of the same round (pattern plain,draft):
             how often the draft is recommended.
           Three ways to form sweeps from the pool: non-overlapping windows in time order (independent sweeps: the
           honest interval, few of them), all windows shifted by one round (overlapping), and --resample random draws
           of runs without replacement (runs of one label are exchangeable in an A/A; many sweeps from few runs,
           which share runs, so their Clopper-Pearson interval is too narrow: a point estimate). Beside each, the rule
           sweep-k had before (one run per arm, plain decoding first and last, a 95% bootstrap over waves).

  python benchmarks/sweep_calibration.py collect --pool runs/cal --draft runs/demo/draft --k 3 --temperature 0 \
      --batch-sizes 1,4 --pattern plain,draft --runs 24
  python benchmarks/sweep_calibration.py analyse --pool runs/cal --rounds 2,3,4 --arms 1,3
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spectool.constants import DEFAULT_DATA  # noqa: E402
from spectool.stats import binomial_interval, recommend, sweep_speedups  # noqa: E402


def collect(a: argparse.Namespace) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415

    from spectool import subproc  # noqa: PLC0415
    from spectool.data import load_source  # noqa: PLC0415
    from spectool.draft.guard import check_speculation  # noqa: PLC0415
    from spectool.models import resolve_model  # noqa: PLC0415
    from spectool.prompts import encode_prompt  # noqa: PLC0415

    pool = Path(a.pool)
    pool.mkdir(parents=True, exist_ok=True)
    path = pool / "pool.jsonl"
    done = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    model = resolve_model(a.model)
    draft = check_speculation(model, "eagle3", a.draft, a.k).draft if a.draft else None  # sweep-k's own pre-flight
    batches = [int(b) for b in a.batch_sizes.split(",")]
    tasks = load_source(a.data, seed=0).tasks("eval", max(batches + [a.min_seqs]))
    tok = AutoTokenizer.from_pretrained(model.path)
    prompts = [encode_prompt(tok, t.prompt) for t in tasks]
    pattern = a.pattern.split(",")
    t_start = time.monotonic()
    for i in range(len(done), a.runs):
        if a.until and time.monotonic() - t_start > a.until:
            print(f"stopped at {i} runs: --until {a.until} s passed", flush=True)
            break
        label = pattern[i % len(pattern)]
        method, k = ("none", 0) if label == "plain" else ("eagle3", a.k)
        t0 = time.time()
        rows = subproc.call("spectool.engine.arms", "measure_arm", dict(
            model_path=model.path, method=method, k=k, drafts={"eagle3": draft} if draft else {}, prompts=prompts,
            batch_sizes=batches, max_tokens=a.max_tokens, temperature=a.temperature, min_seqs=a.min_seqs, seed=0,
            min_seconds=a.min_seconds, log_path=str(pool / "engine.log")), what=f"run {i} ({label})")
        rec = {"index": i, "label": label, "started": t0, "wall_s": time.time() - t0, "rows": rows}
        with path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"run {i} {label}: {rec['wall_s']:.0f} s, tokens/s "
              + " ".join(f"b{r['batch']}={r['tokens_per_s']:.1f}" for r in rows), flush=True)


def _sweep(runs: list[dict], roles: list[tuple[str, int]], rounds: int) -> list[dict]:
    """Sweep rows from consecutive runs: round r's engines are runs[r * E:(r + 1) * E] in time order, given the
    roles in sweep-k's order for that round (reversed every other round)."""
    e = len(roles)
    rows = []
    for r in range(rounds):
        order = roles if r % 2 == 0 else roles[::-1]
        for (method, k), run in zip(order, runs[r * e:(r + 1) * e]):
            rows += [{**x, "method": method, "k": k, "run": r} for x in run["rows"]]
    return rows


def _paired(pairs: list[list[dict]]) -> list[dict]:
    """Sweep rows from (plain run, draft run) pairs, one pair a round."""
    rows = []
    for r, (p, d) in enumerate(pairs):
        rows += [{**x, "method": "none", "k": 0, "run": r} for x in p["rows"]]
        rows += [{**x, "run": r} for x in d["rows"]]
    return rows


def _rounds(plains: list[dict], drafts: list[dict], arms: int) -> list[dict]:
    """Sweep rows of len(plains) rounds: each a plain run and `arms` draft runs (the arms k = 1..arms, all the same
    draft: a gain that is there in every arm)."""
    rows = []
    for r, p in enumerate(plains):
        rows += [{**x, "method": "none", "k": 0, "run": r} for x in p["rows"]]
        for j, d in enumerate(drafts[r * arms:(r + 1) * arms]):
            rows += [{**x, "k": j + 1, "run": r} for x in d["rows"]]
    return rows


def _decide(rows: list[dict], batch: int) -> bool:
    """Whether sweep-k recommends speculation at this batch size on these rows."""
    return recommend(sweep_speedups([x for x in rows if x["batch"] == batch]), [batch], MIN_GAIN)[batch]["method"] != "none"


MIN_GAIN = 0.03  # sweep-k's default --min-gain


def _old_rule(rows: list[dict], batch: int, draws: int = 400) -> bool:
    """The rule sweep-k had before issue 49, for comparison: plain decoding's runs pooled, each arm's speedup with
    a 95% percentile bootstrap over the timed waves of both sides, recommended where its low end clears 1.03."""
    rng = random.Random(0)
    at = [x for x in rows if x["batch"] == batch]
    plain = [w for x in at if x["method"] == "none" for w in x["waves"]]

    def rate(ws):
        return sum(t for t, _ in ws) / sum(s for _, s in ws)

    for arm in sorted({(x["method"], x["k"]) for x in at if x["method"] != "none"}):  # a fixed order: rng reproducible
        waves = [w for x in at if (x["method"], x["k"]) == arm for w in x["waves"]]
        ratios = sorted(rate(rng.choices(waves, k=len(waves))) / rate(rng.choices(plain, k=len(plain)))
                        for _ in range(draws))
        if min(rate(waves) / rate(plain), ratios[int(0.025 * (draws - 1))]) >= 1 + MIN_GAIN:
            return True
    return False


def _old_sweep(runs: list[dict], arms: int) -> list[dict]:
    """Rows of a sweep as the old rule measured it: plain, the arms, plain again (arms + 2 runs)."""
    roles = [("none", 0)] + [("eagle3", j + 1) for j in range(arms)] + [("none", 0)]
    return [{**x, "method": m, "k": k} for (m, k), run in zip(roles, runs) for x in run["rows"]]


def _rate(hits: list[bool]) -> str:
    lo, hi = binomial_interval(sum(hits), len(hits))
    return f"{sum(hits)}/{len(hits)} = {sum(hits) / max(len(hits), 1):.0%} [{lo:.0%}, {hi:.0%}]"


def analyse(a: argparse.Namespace) -> None:
    pool = [json.loads(x) for x in (Path(a.pool) / "pool.jsonl").read_text().splitlines() if x.strip()]
    batches = sorted({r["batch"] for run in pool for r in run["rows"]})
    by_label = {lab: [p for p in pool if p["label"] == lab] for lab in sorted({p["label"] for p in pool})}
    walls = [p["wall_s"] for p in pool]
    print(f"pool: {len(pool)} engine runs ({', '.join(f'{k} {len(v)}' for k, v in by_label.items())}), "
          f"{sum(walls) / 60:.1f} min of engine time, {sum(walls) / len(walls):.0f} s a run")
    for lab, runs in by_label.items():
        for b in batches:
            rates = [next(r["tokens_per_s"] for r in p["rows"] if r["batch"] == b) for p in runs]
            mean = sum(rates) / len(rates)
            sd = (sum((x - mean) ** 2 for x in rates) / max(len(rates) - 1, 1)) ** 0.5
            print(f"  {lab}, batch {b}: {mean:.1f} tokens/s, run-to-run sd {sd / mean:.1%} ({min(rates):.1f}-{max(rates):.1f})")
    out = {"pool": len(pool), "cells": []}
    print("\n| test | arms | rounds | batch | recommended: non-overlapping sweeps [95%] | all windows | "
          "resampled | the old rule, resampled |")
    print("|---|---|---|---|---|---|---|---|")
    for rounds in a.rounds:
        for arms in a.arms:
            roles = [("none", 0)] + [("eagle3", j + 1) for j in range(arms)]
            for lab, runs in by_label.items():  # A/A: one label in every role
                size = len(roles) * rounds
                starts = range(0, len(runs) - size + 1, len(roles))
                rng = random.Random(rounds * 100 + arms)
                draws = [rng.sample(runs, size) for _ in range(a.resample)] if len(runs) >= size else []
                old = [rng.sample(runs, arms + 2) for _ in range(a.resample)] if len(runs) >= arms + 2 else []
                for b in batches:
                    every = [_decide(_sweep(runs[s:s + size], roles, rounds), b) for s in starts]
                    apart = every[::rounds]
                    drawn = [_decide(_sweep(d, roles, rounds), b) for d in draws]
                    before = [_old_rule(_old_sweep(d, arms), b) for d in old]
                    if drawn:
                        print(f"| A/A {lab} | {arms} | {rounds} | {b} | {_rate(apart)} | {_rate(every)} | "
                              f"{_rate(drawn)} | {_rate(before)} |")
                        out["cells"].append({"test": f"A/A {lab}", "arms": arms, "rounds": rounds, "batch": b,
                                             "hits": sum(apart), "n": len(apart), "hits_all": sum(every),
                                             "n_all": len(every), "hits_drawn": sum(drawn), "n_drawn": len(drawn),
                                             "hits_old_rule": sum(before), "n_old_rule": len(before)})
        if "plain" in by_label and "draft" in by_label:  # power: plain then the draft, round by round
            pairs = [p for p in pool if p["label"] in ("plain", "draft")]
            pairs = [pairs[i:i + 2] for i in range(0, len(pairs) - 1, 2)
                     if [p["label"] for p in pairs[i:i + 2]] == ["plain", "draft"]]
            for arms in a.arms:  # arms > 1: that many draft runs a round, so the bound counts as many arms
                rng = random.Random(rounds * 100 + arms)
                plains, drafts = by_label["plain"], by_label["draft"]
                draws = [] if len(plains) < rounds or len(drafts) < rounds * arms else [
                    _rounds(rng.sample(plains, rounds), rng.sample(drafts, rounds * arms), arms) for _ in range(a.resample)]
                olds = [rng.sample(pairs, 2) for _ in range(a.resample)] if len(pairs) >= 2 and arms == 1 else []
                for b in batches:
                    every = [_decide(_paired(pairs[s:s + rounds]), b) for s in range(len(pairs) - rounds + 1)] \
                        if arms == 1 else []
                    apart = every[::rounds]
                    drawn = [_decide(d, b) for d in draws]
                    before = [_old_rule(_old_sweep([p1, d1, p2], 1), b) for (p1, d1), (p2, _) in olds]
                    if drawn:
                        print(f"| power: draft vs plain | {arms} | {rounds} | {b} | {_rate(apart)} | {_rate(every)} | "
                              f"{_rate(drawn)} | {_rate(before) if before else '-'} |")
                        out["cells"].append({"test": "power", "arms": arms, "rounds": rounds, "batch": b,
                                             "hits": sum(apart), "n": len(apart), "hits_all": sum(every),
                                             "n_all": len(every), "hits_drawn": sum(drawn), "n_drawn": len(drawn),
                                             "hits_old_rule": sum(before), "n_old_rule": len(before)})
    (Path(a.pool) / "calibration.json").write_text(json.dumps(out, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--pool", required=True)
    c.add_argument("--model", default="smollm2-135m")
    c.add_argument("--draft")
    c.add_argument("--k", type=int, default=3)
    c.add_argument("--data", default=DEFAULT_DATA)
    c.add_argument("--pattern", default="plain,draft")
    c.add_argument("--batch-sizes", default="1,4")
    c.add_argument("--max-tokens", type=int, default=128)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--min-seqs", type=int, default=8)
    c.add_argument("--min-seconds", type=float, default=10.0)
    c.add_argument("--runs", type=int, default=24)
    c.add_argument("--until", type=float, default=0.0, help="start no run after this many seconds")
    n = sub.add_parser("analyse")
    n.add_argument("--pool", required=True)
    n.add_argument("--rounds", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3])
    n.add_argument("--arms", type=lambda s: [int(x) for x in s.split(",")], default=[1, 3])
    n.add_argument("--resample", type=int, default=400, help="random sweeps drawn from the pool per cell")
    a = ap.parse_args()
    collect(a) if a.cmd == "collect" else analyse(a)


if __name__ == "__main__":
    main()
