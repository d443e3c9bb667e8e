"""sweep-k's decision, calibrated on the real engine: how often it recommends a gain that is not there (A/A), and
how often it finds one that is (power), at its default budget.

  collect: engine runs one after the other, each a fresh engine in its own process (sweep-k's own
           `engine.arms.measure_arm`), the labels of --pattern in turn (e.g. plain,draft: plain decoding, then the
           draft at --k), each run's rows appended to POOL/pool.jsonl as it ends (a killed collection resumes).
           Every run of a label decodes the same prompts with the same seed, so two runs differ by the machine alone.
  analyse: sweeps made of consecutive runs of the pool, as sweep-k would have measured them (rounds of engines in
           time order, the order reversed every other round), decided by sweep-k's own `sweep_k.sweep_speedups` and
           `sweep_k.recommend`:
           - A/A: every engine of the sweep a run of ONE label (plain against plain; the draft against itself),
             ARMS arms beside the baseline; a false alarm = any arm recommended at that batch size;
           - power: the baseline a plain run, the arm a draft run of the same round (pattern plain,draft):
             how often the draft is recommended.
           Three ways to form sweeps from the pool: non-overlapping windows in time order (independent sweeps: the
           honest interval, few of them), all windows shifted by one round (overlapping), and --resample random draws
           of runs without replacement (runs of one label are exchangeable in an A/A; many sweeps from few runs,
           which share runs, so their Clopper-Pearson interval is too narrow: a point estimate). Beside each, the rule
           sweep-k had before (one run per arm, plain decoding first and last, a 95% bootstrap over waves).
           Then A/A with each label's own noise (issue 55): sweeps whose engines' runs come from different labels
           (plain decoding's runs in plain's role and the draft's as the arms, the reverse, one arm the draft's), the
           draft's gain removed first (its seconds scaled by the labels' geometric-mean ratio at each batch size: the
           null-centred bootstrap), so every role is as fast as plain decoding and keeps the spread its label has on
           this machine; the equal-noise cells beside them. Each rate's 95% interval from a bootstrap over runs (the
           pool's runs drawn with replacement, the gain removed again in each), beside the pooled rule (before issue
           55) on the same sweeps.

  simulate: no engines. Sweeps drawn from the design's own model (a machine state shared by a round's engines, each
           engine run with its own noise, log sd per engine as given), decided by `stats.sweep.block_speedups` and
           `sweep_k.recommend`, beside the rule before issue 55 (one residual mean square pooled over the arms x rounds
           table, every arm the same standard error) on the same sweeps. A/A cells where plain decoding and the arms
           differ in noise (as this CPU's engines do) and where one arm is noisy, and power cells; each rate with its
           95% Clopper-Pearson interval (the sweeps are independent).

  python benchmarks/sweep_calibration.py simulate --sweeps 4000                   # about 2 minutes
  python benchmarks/sweep_calibration.py collect --pool runs/cal --draft runs/demo/draft --k 3 --temperature 0 \
      --batch-sizes 1,4 --pattern plain,draft --runs 24
  python benchmarks/sweep_calibration.py analyse --pool runs/cal --rounds 2,3,4 --arms 1,3
  python benchmarks/sweep_calibration.py analyse --pool benchmarks/data/sweep_pool_quiet_2026-11-27.jsonl  # a committed pool
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spectool.commands.sweep_k import recommend, sweep_speedups  # noqa: E402, I001
from spectool.constants import DEFAULT_DATA  # noqa: E402
from spectool.stats.distributions import binomial_interval, student_t_quantile  # noqa: E402, I001
from spectool.stats.sweep import ArmSpeedup, block_speedups, paired_log_rates  # noqa: E402, I001


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
    prompts = [encode_prompt(tok, t.messages) for t in tasks]
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
    committed = a.pool.endswith(".jsonl")  # a committed pool file (read, never written beside) or a collect folder
    path = Path(a.pool) if committed else Path(a.pool) / "pool.jsonl"
    pool = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
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
                        what = ("power: draft vs plain" if arms == 1
                                else f"power: the one draft as {arms} arms (not a sweep over k)")
                        print(f"| {what} | {arms} | {rounds} | {b} | {_rate(apart)} | {_rate(every)} | "
                              f"{_rate(drawn)} | {_rate(before) if before else '-'} |")
                        out["cells"].append({"test": "power", "arms": arms, "rounds": rounds, "batch": b,
                                             "hits": sum(apart), "n": len(apart), "hits_all": sum(every),
                                             "n_all": len(every), "hits_drawn": sum(drawn), "n_drawn": len(drawn),
                                             "hits_old_rule": sum(before), "n_old_rule": len(before)})
    out["bootstrap"] = unequal_noise(pool, by_label, batches, a)
    if not committed:
        (Path(a.pool) / "calibration.json").write_text(json.dumps(out, indent=1))


# A/A cells over the pool's labels, (name, the roles of a sweep's engines given its arms: plain decoding's role first).
# "draft": the draft's runs with its gain over plain decoding removed (`_null`), so every role is as fast as plain
# decoding and each label keeps the run-to-run noise it really has on this machine.
POOL_AA = [
    ("plain everywhere (equal noise)", lambda m: ["plain"] * (m + 1)),
    ("the draft everywhere (equal noise)", lambda m: ["draft"] * (m + 1)),
    ("plain's runs as plain, the draft's as the arms", lambda m: ["plain"] + ["draft"] * m),
    ("the draft's runs as plain, plain's as the arms", lambda m: ["draft"] + ["plain"] * m),
    ("plain's runs as plain, one arm the draft's, the others plain's", lambda m: ["plain", "draft"] + ["plain"] * (m - 1)),
]


def _slowed(row: dict, factor: float) -> dict:
    """One engine run's row at one batch size, `factor` times slower (every timed wave's seconds scaled)."""
    return {**row, "seconds": row["seconds"] * factor, "tokens_per_s": row["tokens_per_s"] / factor,
            "waves": [[t, s * factor] for t, s in row["waves"]]}


def _null(runs: list[dict], plains: list[dict], batches: list[int]) -> list[dict]:
    """`runs` with their gain over `plains` removed (the null-centred bootstrap): at each batch size every run slowed
    by the ratio of the two labels' geometric-mean tokens/s, so in this pool the label is exactly as fast as plain
    decoding and keeps its own spread between runs."""
    def log_mean(rs: list[dict], b: int) -> float:
        return sum(math.log(next(x["tokens_per_s"] for x in r["rows"] if x["batch"] == b)) for r in rs) / len(rs)

    factor = {b: math.exp(log_mean(runs, b) - log_mean(plains, b)) for b in batches}
    return [{**r, "rows": [_slowed(x, factor[x["batch"]]) for x in r["rows"]]} for r in runs]


def _drawn_sweep(rng: random.Random, pools: dict[str, list[dict]], roles: list[str], rounds: int) -> list[dict]:
    """Sweep rows of `rounds` rounds, engine e of every round a run of label roles[e] drawn from `pools` (no pool entry
    twice in one sweep; engine 0 plain decoding's role, the others arms k = 1..)."""
    drawn = {lab: rng.sample(pools[lab], roles.count(lab) * rounds) for lab in set(roles)}
    rows = []
    for r in range(rounds):
        for e, lab in enumerate(roles):
            method, k = ("none", 0) if e == 0 else ("eagle3", e)
            rows += [{**x, "method": method, "k": k, "run": r} for x in drawn[lab].pop()["rows"]]
    return rows


def _decide_pooled(rows: list[dict], batch: int) -> bool:
    """Whether the rule before issue 55 (`pooled_rule`: one standard error for every arm) recommends an arm."""
    at = [x for x in rows if x["batch"] == batch]
    engines = sorted({(x["method"], x["k"]) for x in at}, key=lambda e: (e[0] != "none", e[1]))
    waves = {(x["method"], x["k"], x["run"]): x["waves"] for x in at}
    y = [paired_log_rates([waves[(*e, r)] for e in engines]) for r in sorted({x["run"] for x in at})]
    return _recommends(pooled_rule(y), MIN_GAIN) > 0


def unequal_noise(pool: list[dict], by_label: dict[str, list[dict]], batches: list[int], a: argparse.Namespace) -> list:
    """The A/A cells of POOL_AA on the engine pool, each false-alarm rate from --resample sweeps drawn from the pool
    and its 95% interval from a bootstrap over runs: --boots pools, each label's runs drawn with replacement (the
    draft's gain removed within each), --boot-sweeps sweeps from each. Beside it the pooled rule on the same sweeps."""
    if not {"plain", "draft"} <= set(by_label):
        return []
    rng = random.Random(a.seed)
    print(f"\n## A/A on the engine pool with each label's own noise ({a.resample} sweeps a cell drawn from the pool; "
          f"95% interval: bootstrap over runs, {a.boots} pools x {a.boot_sweeps} sweeps; a false alarm = any arm "
          f"recommended at --min-gain {MIN_GAIN})")
    print("| engines' runs | arms | rounds | batch | now [bootstrap 95%] | the pooled rule (before issue 55) |")
    print("|---|---|---|---|---|---|")
    cells = []
    pools = {"plain": by_label["plain"], "draft": _null(by_label["draft"], by_label["plain"], batches)}
    for name, roles_of in POOL_AA:
        for arms, rounds in a.cells:
            roles = roles_of(arms)
            if arms == 1 and "one arm" in name:
                continue
            if any(roles.count(lab) * rounds > len(pools[lab]) for lab in set(roles)):
                continue
            sweeps = [_drawn_sweep(rng, pools, roles, rounds) for _ in range(a.resample)]
            boots = []
            for _ in range(a.boots):
                raw = {lab: rng.choices(by_label[lab], k=len(by_label[lab])) for lab in ("plain", "draft")}
                bp = {"plain": raw["plain"], "draft": _null(raw["draft"], raw["plain"], batches)}
                boots.append([_drawn_sweep(rng, bp, roles, rounds) for _ in range(a.boot_sweeps)])
            for b in batches:
                hits = [_decide(s, b) for s in sweeps]
                old = [_decide_pooled(s, b) for s in sweeps]
                rates = sorted(sum(_decide(s, b) for s in bs) / len(bs) for bs in boots)
                lo, hi = rates[int(0.025 * (len(rates) - 1))], rates[math.ceil(0.975 * (len(rates) - 1))]
                print(f"| {name} | {arms} | {rounds} | {b} | {sum(hits) / len(hits):.1%} [{lo:.1%}, {hi:.1%}] | "
                      f"{sum(old) / len(old):.1%} |", flush=True)
                cells.append({"test": name, "arms": arms, "rounds": rounds, "batch": b, "hits": sum(hits),
                              "n": len(hits), "boot_lo": lo, "boot_hi": hi, "hits_pooled_rule": sum(old)})
    worst = max(cells, key=lambda c: c["boot_hi"])
    print(f"worst cell: {worst['test']}, {worst['arms']} arms, {worst['rounds']} rounds, batch {worst['batch']}: "
          f"{worst['hits'] / worst['n']:.1%}, bootstrap upper limit {worst['boot_hi']:.1%} (the bound: 5%)")
    return cells


def pooled_rule(log_rates: list[list[float]], alpha: float = 0.05) -> list[ArmSpeedup]:
    """sweep-k's rule before issue 55, for comparison: one residual mean square of the arms x rounds table on
    (engines - 1)(rounds - 1) df, the same standard error sqrt(2 MSE / R) for every arm (equal noise assumed)."""
    rounds, engines = len(log_rates), len(log_rates[0])
    col = [sum(row[a] for row in log_rates) / rounds for a in range(engines)]
    rowm = [sum(row) / engines for row in log_rates]
    grand = sum(rowm) / rounds
    df = (engines - 1) * (rounds - 1)
    mse = sum((log_rates[r][a] - col[a] - rowm[r] + grand) ** 2 for r in range(rounds) for a in range(engines)) / df
    se = (2 * mse / rounds) ** 0.5
    q = student_t_quantile(1 - alpha / (engines - 1), df)
    return [ArmSpeedup(math.exp(col[a] - col[0]), math.exp(col[a] - col[0] - q * se),
                       math.exp(col[a] - col[0] + q * se), se, df, rounds, engines - 1)
            for a in range(1, engines)]


def simulated_log_rates(rng: random.Random, speedups: list[float], sds: list[float], rounds: int,
                        round_sd: float = 0.1) -> list[list[float]]:
    """[rounds][engines] log rates: engine 0 plain decoding, 1.. the arms at their true `speedups`; per round a
    machine state N(0, round_sd) shared by its engines, per engine run its own N(0, sds[engine]) (log sd)."""
    out = []
    for _ in range(rounds):
        machine = rng.gauss(0, round_sd)
        out.append([machine + (0.0 if e == 0 else math.log(speedups[e - 1])) + rng.gauss(0, sd)
                    for e, sd in enumerate(sds)])
    return out


def _recommends(fits: list[ArmSpeedup], min_gain: float) -> int:
    """The arm sweep-k's `sweep_k.recommend` picks on these fits (1-based), 0: none."""
    rows = [{"method": "none", "k": 0, "batch": 1, "speedup": 1.0}]
    for i, f in enumerate(fits):
        rows.append({"method": "eagle3", "k": i + 1, "batch": 1, "speedup": f.speedup}
                    | ({} if math.isnan(f.lo) else {"speedup_lo": f.lo, "speedup_hi": f.hi}))
    return recommend(rows, [1], min_gain)[1]["k"]


# (name, plain's log sd, the arms' log sds): A/A cells (every arm as fast as plain decoding)
AA_CELLS = [
    ("all engines 10%", lambda m: (0.10, [0.10] * m)),
    ("plain 10%, arms 3%", lambda m: (0.10, [0.03] * m)),
    ("plain 15%, arms 2%", lambda m: (0.15, [0.02] * m)),
    ("plain 10%, arms 40% (this CPU, batch 4)", lambda m: (0.10, [0.40] * m)),
    ("plain 40%, arms 10%", lambda m: (0.40, [0.10] * m)),
    ("plain 5%, one arm 20%, the others 5%", lambda m: (0.05, [0.20] + [0.05] * (m - 1))),
]


def simulate(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    rng = random.Random(a.seed)
    n = a.sweeps
    print(f"command: python benchmarks/sweep_calibration.py simulate --sweeps {n} --seed {a.seed}")
    print(f"\n## A/A: every arm as fast as plain decoding ({n} sweeps a cell; a false alarm = any arm recommended)")
    print("| noise per engine run (log sd) | arms | rounds | now, --min-gain 0 | now, 0.03 | pooled rule, 0 | pooled, 0.03 |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for name, noise in AA_CELLS:
        for arms, rounds in ((1, 3), (3, 2), (3, 3), (3, 4), (6, 3)):
            if arms == 1 and "one arm" in name:
                continue
            plain, arm_sds = noise(arms)
            hits = {key: 0 for key in ("now0", "now3", "old0", "old3")}
            for _ in range(n):
                y = simulated_log_rates(rng, [1.0] * arms, [plain, *arm_sds], rounds)
                now, old = block_speedups(y), pooled_rule(y)
                hits["now0"] += _recommends(now, 0.0) > 0
                hits["now3"] += _recommends(now, 0.03) > 0
                hits["old0"] += _recommends(old, 0.0) > 0
                hits["old3"] += _recommends(old, 0.03) > 0
            worst = max(worst, hits["now0"] / n)
            print(f"| {name} | {arms} | {rounds} | " + " | ".join(_rate_n(hits[k], n) for k in hits) + " |")
    print(f"worst A/A cell now, at --min-gain 0: {worst:.1%} (the bound: 5%)")

    print(f"\n## power ({n} sweeps a cell, --min-gain 0.03)")
    print("| noise per engine run (log sd) | arms' true speedups | rounds | now: the fastest arm recommended | now: any "
          "arm | pooled rule: the fastest arm | pooled: any |")
    print("|---|---|---|---|---|---|---|")
    for noise in ((0.10, 0.10), (0.185, 0.20)):
        for speedups, rounds_list in (([1.45], (2, 3, 4)), ([1.45, 1.45, 1.45], (3,)), ([1.45, 1.0, 1.0], (3, 4)),
                                      ([1.45, 1.3, 1.1], (3, 4))):
            for rounds in rounds_list:
                hits = {key: 0 for key in ("now", "now_any", "old", "old_any")}
                best = {i + 1 for i, s in enumerate(speedups) if s == max(speedups)}
                for _ in range(n):
                    y = simulated_log_rates(rng, speedups, [noise[0]] + [noise[1]] * len(speedups), rounds)
                    now, old = _recommends(block_speedups(y), 0.03), _recommends(pooled_rule(y), 0.03)
                    hits["now"] += now in best
                    hits["now_any"] += now > 0
                    hits["old"] += old in best
                    hits["old_any"] += old > 0
                label = ", ".join(f"{s:g}x" for s in speedups) + (" (three arms each truly 1.45x: one draft thrice)"
                                                                   if speedups == [1.45] * 3 else "")
                print(f"| plain {noise[0]:.1%}, arms {noise[1]:.0%} | {label} | {rounds} | "
                      + " | ".join(_rate_n(hits[k], n) for k in hits) + " |")
    print(f"\n(intervals: 95% Clopper-Pearson over independent sweeps); wall time {time.perf_counter() - t0:.0f} s")


def _rate_n(k: int, n: int) -> str:
    lo, hi = binomial_interval(k, n)
    return f"{k / n:.1%} [{lo:.1%}, {hi:.1%}]"


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
    n.add_argument("--boots", type=int, default=200, help="bootstrap pools (runs drawn with replacement) per cell")
    n.add_argument("--boot-sweeps", type=int, default=100, help="sweeps drawn from each bootstrap pool")
    n.add_argument("--cells", type=lambda s: [tuple(map(int, x.split("x"))) for x in s.split(",")],
                   default=[(1, 3), (3, 3), (1, 4)], help="ARMSxROUNDS of the unequal-noise A/A table")
    n.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("simulate")
    m.add_argument("--sweeps", type=int, default=4000, help="simulated sweeps per cell")
    m.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    {"collect": collect, "analyse": analyse, "simulate": simulate}[a.cmd](a)


if __name__ == "__main__":
    main()
