"""Calibration of `draft_refresh.mode: auto` (draft/refresh_policy.py): how often it refreshes on noise alone
(placebo), and how often and how soon it refreshes a draft that is catching up with a moving policy (power).

Placebo: after its scheduled first refresh (step `every`, which measures the cost), any refresh `auto` buys over
a draft that does not change is a false alarm. Two placebos, each replayed at refresh costs from 2 s (a GPU, where
a refresh is cheap next to a step's generation) to this CPU's:
- recorded: the drift benchmark's frozen draft (a draft trained on chain_sum, GRPO on letter_counting) at three
  seeds, and a live `auto` run whose refreshes change nothing (draft_refresh.lr 1e-12: the new draft equals the
  previous one on every rollout). A frozen run measures no agreement: its scheduled refresh is replayed as one
  that changed nothing (rule 3 books 0);
- simulated: the same, many times: acceptance as the recorded frozen seeds show it (their level, one step's noise
  from successive differences, generation seconds), and a first refresh that bought nothing but changed the
  weights (the gain per prompt: noise around the previous draft's, spread as the live auto run measured it);
  with independent steps, and with steps correlated as an AR(1) series (lag-1 correlation 0.3, 0.6 and 0.8; the
  recorded frozen runs showed 0.29-0.37), beside the rule as it read the noise before issue 55.
Power of rules 1-2 (a draft going stale: acceptance falling a fixed amount a step after the first refresh),
simulated with independent and correlated steps, now and before issue 55: what reading the correlation costs.
The bound (stats/refresh.py): at most REFRESH_ALPHA per refresh cycle, at any cost.
Power: the live `auto` run of the drift setting (a real refresh at step `every`), replayed with each cost (the
per-step agreement's seconds scaled as the refresh's: the same trainer-side compute); and simulated from what it
measured: the prompts' [new, previous] gain pairs resampled, its acceptance and generation seconds. How often
`auto` buys a second refresh within the run, and after how many steps.
The rule before issue 49 is replayed beside it on the recorded placebos (its rules 2 and 3 booked noise).

  python benchmarks/refresh_placebo.py                           # replays and simulations: about a minute
  python benchmarks/refresh_placebo.py --legacy benchmarks/data/drift_seed0_2026-11.json

Inputs: tests/data/drift_metrics.json (benchmarks/drift_fixture.py writes it from the runs' metrics.jsonl) and
the 2026-11 drift run's seed-0 arms as committed then (benchmarks/data/drift_seed0_2026-11.json; no script wrote
that subset of its metrics.jsonl, which is gone; it holds acceptance and generation seconds per step).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

from spectool.draft.refresh_policy import RefreshPolicy
from spectool.stats import refresh as stats  # the ledger refresh_policy reads (step_noise is swapped in it below)
from spectool.stats.distributions import binomial_interval
from spectool.stats.refresh import NOISE_WINDOW, REFRESH_ALPHA, step_noise

COSTS = (2.0, 5.0, 8.0, 12.0, 15.0)


class RuleBefore49:
    """The rule as it was before issue 49 (draft/refresh_policy.py at 09c0681), for comparison: rule 2 booked only
    the steps below the first after a refresh, rule 3 the steps against the one before it."""

    def __init__(self, every: int, drop: float):
        self.every, self.drop, self.cost_s, self.reason = every, drop, None, ""
        self.after = self.now = self.before = None
        self.lost_s = self.saved_s = 0.0

    def observe(self, a: float | None, g: float, *_) -> None:
        if a is None:
            return
        if self.after is None:
            self.after = a
        else:
            self.lost_s += g * max(0.0, 1.0 - a / self.after)
        if self.before is not None:
            self.saved_s += g * (1.0 - self.before / a)
        self.now = a

    def due(self, step: int) -> bool:
        if self.cost_s is None and step >= self.every:
            self.reason = "first"
            return True
        if self.after is not None and self.after - 1 >= 0.1 and 1 - (self.now - 1) / (self.after - 1) >= self.drop:
            self.reason = "rule 1"
            return True
        if self.cost_s is not None and self.lost_s >= self.cost_s:
            self.reason = "rule 2"
            return True
        if self.cost_s is not None and self.before is not None and self.saved_s >= self.cost_s:
            self.reason = "rule 3"
            return True
        return False

    def refreshed(self, cost: float) -> None:
        self.before, self.cost_s, self.after, self.now, self.lost_s, self.saved_s = self.now, cost, None, None, 0.0, 0.0


def first_fire(metrics: list[dict], every: int, drop: float, cost: float, watch: float = 1.0,
               rule: str = "now") -> tuple[int | None, str]:
    """`auto` replayed over a run's recorded steps with refreshes costing `cost` seconds and the per-step agreement
    `watch` times its recorded seconds: the first step after which it refreshes besides the scheduled first one
    (None: never), and why. The recorded run past such a refresh is not what `auto` would have generated, so the
    replay stops there, and at the run's own second refresh."""
    p = RefreshPolicy("auto", every=every, drop=drop) if rule == "now" else RuleBefore49(every, drop)
    for r in metrics:
        p.observe(r.get("acceptance_length"), r["gen_s"], r.get("agreement_s", 0.0) * watch, r.get("draft_gain"))
        if p.due(r["step"]):
            if r["step"] != every:
                return r["step"], p.reason
            p.refreshed(cost)
        elif "refresh_s" in r and r["step"] != every:
            return None, "the run's own refresh"
    return None, ""


def retimed(metrics: list[dict], gen_s: float) -> list[dict]:
    """A run's steps with their generation seconds scaled so that steps 2.. average `gen_s` (the drift setting alone on
    this CPU): the live runs of this benchmark shared the machine with another job, which slowed them unevenly; the
    rule reads seconds only against a refresh's cost, so a replay at a cost in the drift setting's seconds needs the
    steps in them."""
    tail = [r["gen_s"] for r in metrics[1:]]
    f = gen_s / (sum(tail) / len(tail))
    return [{**r, "gen_s": r["gen_s"] * f} for r in metrics]


def rate(k: int, n: int) -> str:
    lo, hi = binomial_interval(k, n)
    return f"{k}/{n} = {k / n:.1%} [{lo:.1%}, {hi:.1%}]"


def simulate(rng: random.Random, level: float, sd: float, gen: tuple[float, float], cost: float, watch: float,
             steps: int, every: int, drop: float, pairs: list[list[float]] | None, prompts: int,
             null_pairs_sd: float | None = None, rho: float = 0.0, slope: float = 0.0) -> int | None:
    """One simulated run: acceptance level + noise of sd a step (independent steps, or with `rho` an AR(1) series of
    that lag-1 correlation, the same sd), falling by `slope` a step after the first refresh (a draft going stale),
    generation N(gen) seconds, a refresh of `cost` at step `every`. After it, each step's gain pairs: `pairs`
    resampled (power), or `null_pairs_sd`: the previous draft's gain = the new one's + N(0, sd) (a refresh that
    changed the weights and bought nothing), or none (a frozen draft measures none). The first step of an
    unscheduled refresh (None: none)."""
    p = RefreshPolicy("auto", every=every, drop=drop)
    e = rng.gauss(0, sd)
    for s in range(1, steps + 1):
        e = rho * e + math.sqrt(1 - rho * rho) * rng.gauss(0, sd)
        gain = None
        if p.cost_s is not None:
            if pairs is not None:
                gain = [list(rng.choice(pairs)) for _ in range(prompts)]
            elif null_pairs_sd is not None:
                news = [max(0.01, rng.choice(NEW_GAINS)) for _ in range(prompts)]
                gain = [[x, x + rng.gauss(0, null_pairs_sd)] for x in news]
        p.observe(level + e - slope * max(0, s - every), max(0.1, rng.gauss(*gen)), watch, gain)
        if p.due(s):
            if s != every:
                return s
            p.refreshed(cost)
    return None


def independent_steps(segments: list[list[float]], window: int = NOISE_WINDOW) -> tuple[float, float, float] | None:
    """One step's noise as the rule read it before issue 55, for comparison: von Neumann's sd on as many df as
    differences, steps taken as independent (rho 0)."""
    diffs = [b - a for seg in segments for a, b in zip(seg, seg[1:])][-window:]
    return (math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs))), len(diffs), 0.0) if diffs else None


NEW_GAINS: list[float] = []  # the new draft's agreement-length gain per prompt, as the live auto run measured it


def pair_noise(pairs: list[list[float]]) -> tuple[float, float]:
    """The previous draft's gain as a ratio of the new one's (sum over prompts) and the residual spread per prompt."""
    ratio = sum(p for _, p in pairs) / sum(n for n, _ in pairs)
    resid = [p - ratio * n for n, p in pairs]
    return ratio, math.sqrt(sum(e * e for e in resid) / (len(resid) - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", default="tests/data/drift_metrics.json")
    ap.add_argument("--legacy", default="benchmarks/data/drift_seed0_2026-11.json")
    ap.add_argument("--sims", type=int, default=1000, help="simulated runs per cost")
    ap.add_argument("--steps", type=int, default=32, help="steps of a simulated run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print("command: python benchmarks/refresh_placebo.py " + " ".join(sys.argv[1:]))
    fixture = json.loads(Path(args.fixture).read_text())["arms"]
    legacy = json.loads(Path(args.legacy).read_text())
    every, drop = legacy["every"], legacy["drop"]
    frozen0 = legacy["arms"]["frozen"]
    gens = [r["gen_s"] for r in frozen0[1:]]  # step 1 paid a cold start
    gen = (sum(gens) / len(gens), math.sqrt(sum((g - sum(gens) / len(gens)) ** 2 for g in gens) / (len(gens) - 1)))
    placebos = {"frozen, seed 0 (2026-11)": frozen0}
    placebos.update({name: retimed(a["metrics"], gen[0]) for name, a in fixture.items() if name != "auto-seed0"})
    live_run = fixture["auto-seed0"]["metrics"]
    live = retimed(live_run, gen[0])
    measured = [r["refresh_s"] for r in live_run if "refresh_s" in r][0]
    ref_cost = [r["refresh_s"] for r in legacy["arms"]["auto"] if "refresh_s" in r][0]  # the same refresh, alone
    costs = (*COSTS, round(ref_cost, 1))

    print(f"timings: the drift setting alone on this CPU (the 2026-11 run): generation {gen[0]:.1f} +- {gen[1]:.1f} s a "
          f"step (frozen, steps 2-16), a refresh {ref_cost:.1f} s; the live runs' generation re-timed to it")
    print(f"\n## placebo, recorded: a draft that does not change (every {every}, drop {drop}); refreshes besides the "
          "scheduled first")
    print("| series | steps | " + " | ".join(f"cost {c:g} s" for c in costs) + " | before issue 49: " +
          " | ".join(f"{c:g} s" for c in costs) + " |")
    print("|---|---|" + "---|" * (2 * len(costs)))
    k_now = k_old = n = 0
    for name, m in placebos.items():
        now = [first_fire(m, every, drop, c, watch=c / measured)[0] for c in costs]
        old = [first_fire(m, every, drop, c, rule="before")[0] for c in costs]
        k_now, k_old, n = k_now + sum(x is not None for x in now), k_old + sum(x is not None for x in old), n + len(costs)
        show = lambda xs: " | ".join("-" if x is None else f"step {x}" for x in xs)  # noqa: E731
        print(f"| {name} | {len(m)} | {show(now)} | {show(old)} |")
    print(f"fired (series x costs, not independent): now {rate(k_now, n)}; before issue 49 {rate(k_old, n)}")

    frozen = [m for name, m in placebos.items() if "frozen" in name]
    sd = step_noise([[r["acceptance_length"] for r in m] for m in frozen], window=10**6)[0]
    level = sum(r["acceptance_length"] for m in frozen for r in m) / sum(len(m) for m in frozen)
    pairs = [g for r in live for g in r.get("draft_gain", [])]
    NEW_GAINS.extend(n for n, _ in pairs)
    ratio, pair_sd = pair_noise(pairs)
    per_step = [len(r["draft_gain"]) for r in live if r.get("draft_gain")]
    prompts = round(sum(per_step) / len(per_step))
    agreement = sum(r.get("agreement_s", 0.0) for r in live[every:]) / len(live[every:])
    print(f"\nrecorded inputs: acceptance {level:.3f}, one step's noise {sd:.4f} (successive differences of the frozen "
          f"seeds); the live auto run: a refresh of {measured:.1f} s and agreement {agreement:.2f} s a step after it "
          f"(one thread, another job beside it; both scaled with the refresh's cost below), {len(pairs)} prompt pairs "
          f"({prompts} a step), previous/new gain ratio {ratio:.3f}, residual spread {pair_sd:.3f} a prompt")

    rng = random.Random(args.seed)
    print(f"\n## placebo, simulated ({args.sims} runs of {args.steps} steps a cost; bound {REFRESH_ALPHA:.0%} a cycle)")
    print("| refresh cost s | agreement s a step | fired: a frozen draft | fired: a refresh that changed the weights "
          "and bought nothing |")
    print("|---|---|---|---|")
    for c in (0.0, *costs):
        w = agreement * c / measured
        frozen_fires = sum(simulate(rng, level, sd, gen, c, w, args.steps, every, drop, None, prompts) is not None
                           for _ in range(args.sims))
        neutral = sum(simulate(rng, level, sd, gen, c, w, args.steps, every, drop, None, prompts, pair_sd) is not None
                      for _ in range(args.sims))
        print(f"| {c:g} | {w:.2f} | {rate(frozen_fires, args.sims)} | {rate(neutral, args.sims)} |")

    print(f"\n## placebo, simulated with correlated steps: AR(1) noise of the same sd ({args.sims} runs of {args.steps} "
          "steps a cost; fired besides the first refresh)")
    print("| lag-1 correlation | refresh cost s | fired: a frozen draft | a refresh that bought nothing | the same "
          "frozen draft, the slope's se for independent steps (before issue 55) |")
    print("|---|---|---|---|---|")
    for rho in (0.3, 0.6, 0.8):
        for c in (0.0, 2.0, costs[-1]):
            w = agreement * c / measured
            cells = []
            for null_sd, noise in ((None, step_noise), (pair_sd, step_noise), (None, independent_steps)):
                stats.step_noise = noise
                cells.append(sum(simulate(rng, level, sd, gen, c, w, args.steps, every, drop, None, prompts, null_sd,
                                          rho=rho) is not None for _ in range(args.sims)))
                stats.step_noise = step_noise
            print(f"| {rho:g} | {c:g} | " + " | ".join(rate(k, args.sims) for k in cells) + " |")

    long_steps = 2 * args.steps  # audit 2026-11c M4: at 0.8 the rule before it fired in 10.2% of 64-step runs
    print(f"\n## placebo, simulated with correlated steps over {long_steps} steps ({args.sims} runs a cell)")
    print("| lag-1 correlation | refresh cost s | fired: a frozen draft | the same, the slope's se for independent steps |")
    print("|---|---|---|---|")
    for c in (0.0, 2.0):
        w = agreement * c / measured
        cells = []
        for noise in (step_noise, independent_steps):
            stats.step_noise = noise
            cells.append(sum(simulate(rng, level, sd, gen, c, w, long_steps, every, drop, None, prompts, None,
                                      rho=0.8) is not None for _ in range(args.sims)))
            stats.step_noise = step_noise
        print(f"| 0.8 | {c:g} | " + " | ".join(rate(k, args.sims) for k in cells) + " |")

    print(f"\n## power, rules 1-2: a draft going stale after its first refresh ({args.sims} runs of {args.steps} steps; "
          "acceptance falls by the slope a step from the refresh on)")
    print("| fall a step | lag-1 correlation | refresh cost s | fired: now | median steps after the refresh "
          "(10th-90th) | fired: the slope's se for independent steps (before issue 55) | median steps |")
    print("|---|---|---|---|---|---|---|")
    for fall in (0.002, 0.005):
        for rho in (0.0, 0.3):
            for c in (2.0, costs[-1]):
                w = agreement * c / measured
                cells = []
                for noise in (step_noise, independent_steps):
                    stats.step_noise = noise
                    fires = [simulate(rng, level, sd, gen, c, w, args.steps, every, drop, None, prompts, None, rho=rho,
                                      slope=fall) for _ in range(args.sims)]
                    stats.step_noise = step_noise
                    after = sorted(x - every for x in fires if x is not None)
                    cells += [rate(len(after), args.sims), f"{after[len(after) // 2]} ({after[len(after) // 10]}-"
                              f"{after[(9 * len(after)) // 10]})" if after else "-"]
                print(f"| {fall:g} | {rho:g} | {c:g} | " + " | ".join(cells) + " |")

    print("\n## power: the live auto run (a draft from another task, the policy moving), replayed")
    print("| refresh cost s | agreement s a step | second refresh (step, why) |")
    print("|---|---|---|")
    for c in costs:
        step, why = first_fire(live, every, drop, c, watch=c / measured)
        print(f"| {c:g} | {agreement * c / measured:.2f} | {'-' if step is None else f'step {step}: {why}'} |")
    post = [r for r in live[every:] if r.get("acceptance_length")]
    a = [r["acceptance_length"] for r in post]
    a_level, a_sd = sum(a) / len(a), step_noise([a], window=10**6)[0]
    print(f"\n## power, simulated from the live run ({args.sims} runs of {args.steps} steps a cost: its prompt pairs "
          f"resampled, acceptance {a_level:.3f} +- {a_sd:.3f})")
    print("| refresh cost s | agreement s a step | fired | steps after the first refresh: median (10th-90th pct) |")
    print("|---|---|---|---|")
    for c in costs:
        w = agreement * c / measured
        fires = [simulate(rng, a_level, a_sd, gen, c, w, args.steps, every, drop, pairs, prompts)
                 for _ in range(args.sims)]
        after = sorted(s - every for s in fires if s is not None)
        when = (f"{after[len(after) // 2]} ({after[len(after) // 10]}-{after[(9 * len(after)) // 10]})"
                if after else "-")
        print(f"| {c:g} | {w:.2f} | {rate(len(after), args.sims)} | {when} |")
    print(f"\n(intervals: 95% Clopper-Pearson); wall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
