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
           draft's gain removed first (`_null`: its seconds scaled so that its mean paired log rate against plain's
           runs, the statistic the decision reads, is plain's), so every role is as fast as plain decoding and keeps
           the spread its label has on this machine; the equal-noise cells beside them. Each role's run drawn WITH
           replacement from the centred pool (`_drawn_sweep`; drawn without, a sweep leaked the centring: audit-2026-11c
           M1), the labels in sorted order (the table is the same under any PYTHONHASHSEED), --null-sweeps sweeps a
           cell, decided at --min-gain 0 (the 5% bound itself) and at the default 0.03 (which adds a margin), each
           rate with its Monte Carlo standard error and a 95% bootstrap over runs (--boots pools, each label's runs
           drawn with replacement and the gain removed again in each, --boot-sweeps sweeps from each), beside the
           pooled rule (before issue 55) on the same sweeps. The one-label A/A above draws without replacement: two
           disjoint subsamples of one pool differ with no finite-population correction, so it needs no centring.

  simulate: no engines. Sweeps drawn from the design's own model (a machine state shared by a round's engines, each
           engine run with its own noise, log sd per engine as given), decided by `stats.sweep.block_speedups` and
           `sweep_k.recommend`, beside the rule before issue 55 (one residual mean square pooled over the arms x rounds
           table, every arm the same standard error) on the same sweeps. A/A cells where plain decoding and the arms
           differ in noise (as this CPU's engines do), where one arm is noisy, and where runs are now and then slowed
           (skewed noise: the bound does not hold there, audit-2026-11c M3), and power cells, among them the default
           sweep's beside `stats.sweep.power` (what sweep-k prints); each rate with its 95% Clopper-Pearson interval
           (the sweeps are independent).

  python benchmarks/sweep_calibration.py simulate --sweeps 20000                  # about 2 minutes
  python benchmarks/sweep_calibration.py collect --pool runs/cal --draft runs/demo/draft --k 3 --temperature 0 \
      --batch-sizes 1,4 --pattern plain,draft --runs 24
  python benchmarks/sweep_calibration.py analyse --pool runs/cal --rounds 2,3,4 --arms 1,3
  python benchmarks/sweep_calibration.py analyse --pool benchmarks/data/sweep_pool_quiet_2026-11-27.jsonl \
      --rounds 2,3,4 --arms 1,3                 # a committed pool: benchmarks/data/sweep_calibration.txt
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
from spectool.stats.sweep import ArmSpeedup, block_speedups, paired_log_rates, power  # noqa: E402, I001


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


def _decide(rows: list[dict], batch: int, min_gain: float | None = None) -> bool:
    """Whether sweep-k recommends speculation at this batch size on these rows (at --min-gain `min_gain`, else
    MIN_GAIN)."""
    return _decide_at(rows, batch, (MIN_GAIN if min_gain is None else min_gain,))[0]


def _decide_at(rows: list[dict], batch: int, gains: tuple[float, ...]) -> list[bool]:
    """`_decide` at each of `gains` (one sweep_speedups for all)."""
    fit = sweep_speedups([x for x in rows if x["batch"] == batch])
    return [recommend(fit, [batch], g)[batch]["method"] != "none" for g in gains]


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


def _split(pairs: list[list[bool]]) -> tuple[list[bool], list[bool]]:
    """[[at MIN_GAIN, at 0], ...] -> (the decisions at MIN_GAIN, at 0)."""
    return [x[0] for x in pairs], [x[1] for x in pairs]


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
    print(f"\n| test | arms | rounds | batch | recommended: non-overlapping sweeps [95%] | all windows | "
          f"resampled | resampled, --min-gain 0 | the old rule, resampled |   (--min-gain {MIN_GAIN} unless said)")
    print("|---|---|---|---|---|---|---|---|---|")
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
                    drawn, drawn0 = _split([_decide_at(_sweep(d, roles, rounds), b, (MIN_GAIN, 0.0)) for d in draws])
                    before = [_old_rule(_old_sweep(d, arms), b) for d in old]
                    if drawn:
                        print(f"| A/A {lab} | {arms} | {rounds} | {b} | {_rate(apart)} | {_rate(every)} | "
                              f"{_rate(drawn)} | {_rate(drawn0)} | {_rate(before)} |")
                        out["cells"].append({"test": f"A/A {lab}", "arms": arms, "rounds": rounds, "batch": b,
                                             "hits": sum(apart), "n": len(apart), "hits_all": sum(every),
                                             "n_all": len(every), "hits_drawn": sum(drawn), "n_drawn": len(drawn),
                                             "hits_drawn_min_gain_0": sum(drawn0),
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
                    drawn, drawn0 = _split([_decide_at(d, b, (MIN_GAIN, 0.0)) for d in draws])
                    before = [_old_rule(_old_sweep([p1, d1, p2], 1), b) for (p1, d1), (p2, _) in olds]
                    if drawn:
                        what = ("power: draft vs plain" if arms == 1
                                else f"power: the one draft as {arms} arms (not a sweep over k)")
                        print(f"| {what} | {arms} | {rounds} | {b} | {_rate(apart)} | {_rate(every)} | "
                              f"{_rate(drawn)} | {_rate(drawn0)} | {_rate(before) if before else '-'} |")
                        out["cells"].append({"test": "power", "arms": arms, "rounds": rounds, "batch": b,
                                             "hits": sum(apart), "n": len(apart), "hits_all": sum(every),
                                             "n_all": len(every), "hits_drawn": sum(drawn), "n_drawn": len(drawn),
                                             "hits_drawn_min_gain_0": sum(drawn0),
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


def _rate_over(waves: list[list[float]]) -> float:
    return sum(t for t, _ in waves) / sum(s for _, s in waves)


def _null(runs: list[dict], plains: list[dict], batches: list[int]) -> list[dict]:
    """`runs` with their gain over `plains` removed (the null-centred bootstrap): at each batch size every run slowed
    by one factor, the mean over every (plain run, run) pair of the statistic sweep-k's decision reads
    (`paired_log_rates`: the log rate over the first n waves both decoded, n the fewer), so that a round of one of
    each is, on average over the pool, exactly as fast as plain decoding on that statistic, and the label keeps its
    own spread between runs. (Centring tokens/s over all of a run's waves left the shared pool's draft 8.7% faster
    at batch 4 on the paired statistic, where its runs decoded 4-6 waves and plain decoding's 4: audit-2026-11c M1.)
    In these pools plain decoding's runs decode no more waves than the draft's, so n is also the round's n in every
    mixed sweep."""
    def waves(r: dict, b: int) -> list[list[float]]:
        return next(x["waves"] for x in r["rows"] if x["batch"] == b)

    def gain(b: int) -> float:
        diffs = [math.log(_rate_over(d[:n]) / _rate_over(p[:n])) for p in (waves(r, b) for r in plains)
                 for d in (waves(r, b) for r in runs) for n in [min(len(p), len(d))]]
        return sum(diffs) / len(diffs)

    factor = {b: math.exp(gain(b)) for b in batches}
    return [{**r, "rows": [_slowed(x, factor[x["batch"]]) for x in r["rows"]]} for r in runs]


def _drawn_sweep(rng: random.Random, pools: dict[str, list[dict]], roles: list[str], rounds: int) -> list[dict]:
    """Sweep rows of `rounds` rounds, engine e of every round a run of label roles[e] drawn WITH replacement from
    `pools` (engine 0 plain decoding's role, the others arms k = 1..). With replacement: each role is then an
    independent draw from the label's runs, as a real sweep's engine runs are; drawn without replacement from the
    pool the draft was centred on, a sweep's runs were pulled toward that centre (a finite-population correction of
    1 - R/12 the t bound does not know: 3.3-4.0% measured where the truth was 4.6-5.1%, audit-2026-11c M1). The
    labels in sorted order: the draws do not depend on the string hash (PYTHONHASHSEED)."""
    drawn = {lab: rng.choices(pools[lab], k=roles.count(lab) * rounds) for lab in sorted(set(roles))}
    rows = []
    for r in range(rounds):
        for e, lab in enumerate(roles):
            method, k = ("none", 0) if e == 0 else ("eagle3", e)
            rows += [{**x, "method": method, "k": k, "run": r} for x in drawn[lab].pop()["rows"]]
    return rows


def _decide_pooled(rows: list[dict], batch: int, min_gain: float) -> bool:
    """Whether the rule before issue 55 (`pooled_rule`: one standard error for every arm) recommends an arm."""
    at = [x for x in rows if x["batch"] == batch]
    engines = sorted({(x["method"], x["k"]) for x in at}, key=lambda e: (e[0] != "none", e[1]))
    waves = {(x["method"], x["k"], x["run"]): x["waves"] for x in at}
    y = [paired_log_rates([waves[(*e, r)] for e in engines]) for r in sorted({x["run"] for x in at})]
    return _recommends(pooled_rule(y), min_gain) > 0


GAINS = (0.0, MIN_GAIN)  # the A/A at the bound itself (--min-gain 0) and at sweep-k's default margin


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[int(q * (len(xs) - 1))] if q < 0.5 else xs[math.ceil(q * (len(xs) - 1))]


def unequal_noise(pool: list[dict], by_label: dict[str, list[dict]], batches: list[int], a: argparse.Namespace) -> list:
    """The A/A cells of POOL_AA on the engine pool at --min-gain 0 (the bound) and 0.03: each false-alarm rate from
    --null-sweeps sweeps drawn with replacement from the null-centred pool (`_null`, `_drawn_sweep`), with its Monte
    Carlo standard error, and its 95% interval from a bootstrap over runs: --boots pools, each label's runs drawn with
    replacement (the draft's gain removed within each), --boot-sweeps sweeps from each (the percentiles of the pools'
    rates: the pool's luck plus each pool's own Monte Carlo error, sqrt(p(1 - p) / boot-sweeps), said beside it).
    Beside it the pooled rule (before issue 55) on the same sweeps."""
    if not {"plain", "draft"} <= set(by_label):
        return []
    rng = random.Random(a.seed)
    print(f"\n## A/A on the engine pool with each label's own noise ({a.null_sweeps} sweeps a cell drawn with replacement "
          f"from the null-centred pool; MC se: that rate's binomial standard error; 95% interval: bootstrap over runs, "
          f"{a.boots} pools x {a.boot_sweeps} sweeps, each pool's rate with its own MC se of about "
          f"sqrt(p(1 - p) / {a.boot_sweeps}) inside the interval; a false alarm = any arm recommended; the bound: 5%)")
    print("| engines' runs | arms | rounds | batch | --min-gain 0 (the bound) [bootstrap 95%] | MC se | "
          f"--min-gain {MIN_GAIN} [bootstrap 95%] | pooled rule (before issue 55), 0 / {MIN_GAIN} |")
    print("|---|---|---|---|---|---|---|---|")
    cells = []
    pools = {"plain": by_label["plain"], "draft": _null(by_label["draft"], by_label["plain"], batches)}
    for name, roles_of in POOL_AA:
        for arms, rounds in a.cells:
            roles = roles_of(arms)
            if arms == 1 and "one arm" in name:
                continue
            sweeps = [_drawn_sweep(rng, pools, roles, rounds) for _ in range(a.null_sweeps)]
            boots = []  # [pool][batch][gain]: hits
            for _ in range(a.boots):
                raw = {lab: rng.choices(by_label[lab], k=len(by_label[lab])) for lab in ("plain", "draft")}
                bp = {"plain": raw["plain"], "draft": _null(raw["draft"], raw["plain"], batches)}
                drawn = [_drawn_sweep(rng, bp, roles, rounds) for _ in range(a.boot_sweeps)]
                boots.append({b: [sum(x) for x in zip(*(_decide_at(s, b, GAINS) for s in drawn))] for b in batches})
            for b in batches:
                hits = [sum(x) for x in zip(*(_decide_at(s, b, GAINS) for s in sweeps))]
                old = [sum(_decide_pooled(s, b, g) for s in sweeps) for g in GAINS]
                n = len(sweeps)
                cell = {"test": name, "arms": arms, "rounds": rounds, "batch": b, "n": n, "boots": a.boots,
                        "boot_sweeps": a.boot_sweeps}
                shown = []
                for g, h, o in zip(GAINS, hits, old):
                    rates = [bs[b][GAINS.index(g)] / a.boot_sweeps for bs in boots]
                    lo, hi = _pct(rates, 0.025), _pct(rates, 0.975)
                    key = f"min_gain_{g:g}"
                    cell[key] = {"hits": h, "rate": h / n, "mc_se": math.sqrt(h / n * (1 - h / n) / n),
                                 "boot_lo": lo, "boot_hi": hi, "hits_pooled_rule": o}
                    shown.append(f"{h / n:.1%} [{lo:.1%}, {hi:.1%}]")
                se0 = cell["min_gain_0"]["mc_se"]
                print(f"| {name} | {arms} | {rounds} | {b} | {shown[0]} | {se0:.1%} | {shown[1]} | "
                      f"{old[0] / n:.1%} / {old[1] / n:.1%} |", flush=True)
                cells.append(cell)
    for g in GAINS:
        key = f"min_gain_{g:g}"
        worst = max(cells, key=lambda c: c[key]["rate"])
        top = max(cells, key=lambda c: c[key]["boot_hi"])
        print(f"--min-gain {g:g}: cells {min(c[key]['rate'] for c in cells):.1%}-{worst[key]['rate']:.1%} (worst: "
              f"{worst['test']}, {worst['arms']} arms, {worst['rounds']} rounds, batch {worst['batch']}, MC se "
              f"{worst[key]['mc_se']:.1%}); highest bootstrap upper limit {top[key]['boot_hi']:.1%} ({top['test']}, "
              f"{top['arms']}x{top['rounds']}, batch {top['batch']}) (the bound: 5%)")
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
                        round_sd: float = 0.1, skewed: bool = False) -> list[list[float]]:
    """[rounds][engines] log rates: engine 0 plain decoding, 1.. the arms at their true `speedups`; per round a
    machine state N(0, round_sd) shared by its engines, per engine run its own noise of log sd sds[engine]: normal,
    or `skewed`: s - Exp(mean s), mean 0 (contention only ever slows a run: usually fast, now and then much slower)."""
    out = []
    for _ in range(rounds):
        machine = rng.gauss(0, round_sd)
        out.append([machine + (0.0 if e == 0 else math.log(speedups[e - 1]))
                    + (sd - rng.expovariate(1 / sd) if skewed else rng.gauss(0, sd)) for e, sd in enumerate(sds)])
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
    # skewed noise (audit-2026-11c M3): each run's log rate s - Exp(mean s), as fast as plain decoding on average
    ("slowdowns (skewed), all engines 10%", lambda m: (0.10, [0.10] * m)),
    ("slowdowns (skewed), plain 2%, arms 15%", lambda m: (0.02, [0.15] * m)),
    ("slowdowns (skewed), plain 5%, arms 30%", lambda m: (0.05, [0.30] * m)),
]


def simulate(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    rng = random.Random(a.seed)
    n = a.sweeps
    print(f"command: python benchmarks/sweep_calibration.py simulate --sweeps {n} --seed {a.seed}")
    print(f"\n## A/A: every arm as fast as plain decoding ({n} sweeps a cell; a false alarm = any arm recommended)")
    print("| noise per engine run (log sd) | arms | rounds | now, --min-gain 0 | now, 0.03 | pooled rule, 0 | pooled, 0.03 |")
    print("|---|---|---|---|---|---|---|")
    worst = {False: 0.0, True: 0.0}
    for name, noise in AA_CELLS:
        for arms, rounds in ((1, 3), (3, 2), (3, 3), (3, 4), (6, 3)):
            if arms == 1 and "one arm" in name:
                continue
            plain, arm_sds = noise(arms)
            hits = {key: 0 for key in ("now0", "now3", "old0", "old3")}
            for _ in range(n):
                y = simulated_log_rates(rng, [1.0] * arms, [plain, *arm_sds], rounds, skewed="skewed" in name)
                now, old = block_speedups(y), pooled_rule(y)
                hits["now0"] += _recommends(now, 0.0) > 0
                hits["now3"] += _recommends(now, 0.03) > 0
                hits["old0"] += _recommends(old, 0.0) > 0
                hits["old3"] += _recommends(old, 0.03) > 0
            worst["skewed" in name] = max(worst["skewed" in name], hits["now0"] / n)
            print(f"| {name} | {arms} | {rounds} | " + " | ".join(_rate_n(hits[k], n) for k in hits) + " |")
    print(f"worst A/A cell now, at --min-gain 0: normal noise {worst[False]:.1%}, skewed slowdowns {worst[True]:.1%} "
          "(the bound: 5%)")

    print(f"\n## power of the default sweep (--k 1..5: 5 arms, one truly 1.3x, the others 1.0-1.2x; every engine the "
          f"same normal log sd, plain's included), --min-gain 0.03 ({n} sweeps a cell), beside stats.sweep.power (what "
          "sweep-k prints: one arm's chance to clear its bound, sd of the differences sqrt(2) x the engines')")
    print("| noise per engine run (log sd) | rounds | the 1.3x arm recommended | any arm | stats.sweep.power |")
    print("|---|---|---|---|---|")
    for sd in (0.03, 0.05, 0.10):
        for rounds in (2, 3, 4, 6):
            best = anyr = 0
            for _ in range(n):
                pick = _recommends(block_speedups(simulated_log_rates(rng, [1.3, 1.0, 1.1, 1.15, 1.2], [sd] * 6,
                                                                      rounds)), 0.03)
                best += pick == 1
                anyr += pick > 0
            print(f"| {sd:.0%} | {rounds} | {_rate_n(best, n)} | {_rate_n(anyr, n)} | "
                  f"{power(math.sqrt(2) * sd, rounds, 5):.1%} |")

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
    n.add_argument("--null-sweeps", type=int, default=4000,
                   help="sweeps a cell of the unequal-noise A/A table, drawn with replacement from the centred pool")
    n.add_argument("--boots", type=int, default=100, help="bootstrap pools (runs drawn with replacement) per cell")
    n.add_argument("--boot-sweeps", type=int, default=1000, help="sweeps drawn from each bootstrap pool")
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
