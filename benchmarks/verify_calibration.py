"""Calibration of `spectool verify`'s verdict on the real engine (issue 49): how often exact sampling is called
NOT LOSSLESS (the false-alarm rate, at most the family-wise level) and how often each lossy sampler is (the power),
from high entropy to a near-deterministic policy, with Clopper-Pearson 95% intervals.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/verify_calibration.py sample --cell t1 --reps-exact 12 --reps-lossy 8
    flock /tmp/heavy.lock .venv/bin/python benchmarks/verify_calibration.py sample --cell t03
    flock /tmp/heavy.lock .venv/bin/python benchmarks/verify_calibration.py sample --cell sharp8
    .venv/bin/python benchmarks/verify_calibration.py report          # the table, from the scored pools (no engine)
    .venv/bin/python benchmarks/verify_calibration.py simulate        # the same verdicts on simulated policies
    .venv/bin/python benchmarks/verify_calibration.py edge            # the computed-power rule at its edge (simulated)

`simulate` runs the same verdict (verify.verdict on stats.lossless.policy_test and token_test) on a simulated policy, a Markov
chain over 64 tokens whose next-token logits depend on the last token, scaled from high entropy to near-deterministic,
with hundreds of repetitions: the false-alarm rate with a tight interval, which the engine's dozen cannot give.
`edge` runs the 10%-hotter sampler as the speculative arm with `--control temperature` (an independent sample of it)
at sizes around the computed-power bar, where LOSSLESS is wrong every time it is said (issue 55, M3).

Cells: t1 (the embedded SmolLM2 at T=1), t03 (the same at T=0.3), sharp8 (a copy whose untied lm_head is 8x the
embedding, at T=1: a late-RL policy, near-deterministic). Prompts: four short raw-text openings (a short prompt keeps
the engine's prefill, most of its work at 6 positions, small).
Samplers, one engine each, k=2, greedy proposals: plain and speculative decoding (exact); truncated (top-p 0.9) and
temperature (sampled at 1.1 T) on plain decoding; offbyone (the acceptance rule off by one) and unpatched (the stock CPU
rejection sampler), speculative, each in a child process (engine/arms.sample_control, engine/cpu_fix.py).
Speculation: the policy drafts itself (vLLM's draft-model speculation, `verify --draft-model policy`), so its proposal
is the policy's argmax and is accepted as often as any greedy draft's can be: the acceptance path, where an off-by-one
rule bites, runs most. `--draft DIR` uses an EAGLE-3 draft instead.

Reuse of the engine's samples, and why it is valid: each sampler draws one pool of completions per prompt, once, and
the policy scores the pool once (verify.score_tokens); `sample` keeps them (OUT/<cell>/<sampler>.pt) and `report`
forms the repetitions from them. Repetition i takes completions [i*S, (i+1)*S) of every prompt from every pool:
disjoint slices of independent draws (every completion has its own random stream), so the repetitions are independent
verify runs of S samples per prompt, and a rate over them is a binomial proportion (Clopper-Pearson 95%). For each
lossy sampler L, in repetition i:
 - exact sampling with `--control L`: verify.verdict(plain_i, speculative_i, L_i). NOT LOSSLESS is a false alarm
   (it does not depend on the control); LOSSLESS needs L_i rejected with power shown (for top-p 0.9 and the
   temperature error: the power against it computed at these positions >= verify.POWER, 99.4%);
 - L itself with `--control L`: verify.verdict(plain_i, L_i in the speculative arm's place, L_(i+1)): NOT LOSSLESS is
   the power; LOSSLESS would be wrong (power shown on the control's slice, not on this one).
The plain slice is shared by these verdicts: each sees what a real run would, so each rate is unbiased; the rates of
different samplers in one cell are correlated.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

CELLS = {  # name -> (policy: "embedded" or an lm_head scale, temperature)
    "t1": ("embedded", 1.0),
    "t03": ("embedded", 0.3),
    "sharp8": (8.0, 1.0),
}
EXACT = ("plain", "speculative")
LOSSY = ("truncated", "temperature", "offbyone", "unpatched")
PROMPTS = ["The capital of France is", "Once upon a time, there was a", "def fibonacci(n):",
           "The best way to learn a language is"]


def policy_folder(cell: str, out: Path) -> str:
    """The cell's policy: the embedded SmolLM2, or a copy with an untied lm_head scaled by the cell's factor."""
    from spectool.models import resolve_model

    kind, _ = CELLS[cell]
    src = resolve_model("smollm2-135m").path
    if kind == "embedded":
        return src
    folder = out / "policies" / f"sharp{kind:g}"
    if not (folder / "config.json").exists():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        cfg = AutoConfig.from_pretrained(src)
        cfg.tie_word_embeddings = False
        model = AutoModelForCausalLM.from_pretrained(src, config=cfg, dtype=torch.float32)
        with torch.no_grad():
            model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone() * kind)
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(src).save_pretrained(folder)
    return str(folder)


def sample(a) -> None:
    """Draw and score every sampler's pool of one cell (engines: run it under the heavy-job lock)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spectool.commands.verify import score_tokens
    from spectool.engine.arms import sample_arm, sample_control

    t_start = time.perf_counter()
    out = Path(a.out) / a.cell
    out.mkdir(parents=True, exist_ok=True)
    model = policy_folder(a.cell, Path(a.out))
    temperature = CELLS[a.cell][1]
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(p).input_ids for p in PROMPTS[: a.prompts]]
    common = dict(model_path=model, k=a.k, prompts=prompts, positions=a.positions, temperature=temperature,
                  draft_sampling="greedy", top_p=1.0, method="eagle3" if a.draft else "draft_model")
    policy = None
    for i, name in enumerate(EXACT + LOSSY):
        path = out / f"{name}.pt"
        if path.exists():  # a rerun resumes
            continue
        reps = a.reps_exact if name in EXACT or name == "unpatched" else a.reps_lossy
        draft = (a.draft or model) if name in ("speculative", "offbyone", "unpatched") else None
        arm = dict(common, draft=draft, samples=a.samples * reps, seed=a.seed + i)
        if draft is None:
            arm["method"] = "eagle3"  # plain decoding: eagle3 without a draft (sample_arm)
        t0 = time.perf_counter()
        got = sample_arm(**arm) if name in EXACT else sample_control(name, **arm)
        t1 = time.perf_counter()
        if policy is None:
            policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        scored = [score_tokens(policy, p, rs, temperature) for p, rs in zip(prompts, got["responses"])]
        t2 = time.perf_counter()
        torch.save({"responses": got["responses"], "logprobs": got["logprobs"], "scored": scored,
                    "mean_acceptance_length": got["mean_acceptance_length"], "sampler_fix": got["sampler_fix"],
                    "samples": a.samples, "reps": reps, "sample_s": t1 - t0, "score_s": t2 - t1}, path)
        n = sum(len(r) for rs in got["responses"] for r in rs)
        print(f"{a.cell} {name}: {n} tokens sampled in {t1 - t0:.0f} s, scored in {t2 - t1:.0f} s", flush=True)
    print(f"{a.cell}: wall time {time.perf_counter() - t_start:.0f} s", flush=True)


def _slice(arm: dict, i: int) -> tuple[dict, list]:
    """Repetition i's completions of a pool: [i*S, (i+1)*S) of every prompt."""
    s = arm["samples"]
    part = {"responses": [rs[i * s:(i + 1) * s] for rs in arm["responses"]],
            "logprobs": [lp[i * s:(i + 1) * s] for lp in arm["logprobs"]],
            "mean_acceptance_length": arm["mean_acceptance_length"]}
    return part, [sc[i * s:(i + 1) * s] for sc in arm["scored"]]


def report(a) -> None:
    import torch

    from spectool.commands.verify import arm_result, logprob_rule, verdict
    from spectool.config.verify import VerifyConfig
    from spectool.engine.arms import LOSSY_CONTROLS
    from spectool.engine.compat import is_cpu_build
    from spectool.stats.distributions import binomial_interval

    rule = logprob_rule(VerifyConfig(alpha=a.alpha), is_cpu_build())
    rows, wall = [], 0.0
    for cell in CELLS:
        folder = Path(a.out) / cell
        if not all((folder / f"{n}.pt").exists() for n in EXACT + LOSSY):
            print(f"{cell}: not sampled yet", file=sys.stderr)
            continue
        pools = {n: torch.load(folder / f"{n}.pt", weights_only=False) for n in EXACT + LOSSY}
        wall += sum(p["sample_s"] + p["score_s"] for p in pools.values())
        positions = max(len(r) for rs in pools["plain"]["responses"] for r in rs)

        scored_arms = {}  # (sampler, its slice, plain's slice or None) -> (ArmResult, the slice): each scored once

        def arm(name: str, i: int, against: int | None, label: str):
            """Slice i of a sampler's pool as verify's arm `label`, its token tests against plain's slice `against`."""
            if (name, i, against) not in scored_arms:
                part, scored = _slice(pools[name], i)
                plain_part = None if against is None else _slice(pools["plain"], against)[0]
                scored_arms[name, i, against] = (
                    arm_result(label, LOSSY_CONTROLS.get(name, name), part, scored, plain_part, positions,
                                a.alpha / (2 + len(part["responses"]) * positions)), part)
            r, part = scored_arms[name, i, against]
            return dataclasses.replace(r, name=label, control=name if label == "lossy control" else ""), part

        exact_runs = pools["plain"]["reps"]
        exact, lossy, tops, res = {n: [] for n in LOSSY}, {n: [] for n in LOSSY}, [], []
        false_alarms = 0
        for i in range(exact_runs):
            plain = arm("plain", i, None, "plain")[0]
            spec = arm("speculative", i, i, "speculative")[0]
            tops.append(spec.policy.mean_top)
            for name in LOSSY:
                reps = pools[name]["reps"]
                said, _, alpha_each = verdict([plain, spec, arm(name, i % reps, i, "lossy control")[0]],
                                              a.alpha, rule)
                if name == LOSSY[0]:
                    false_alarms += said == "NOT LOSSLESS"
                    res.append(str(spec.policy.detectable(alpha_each)))
                if i >= reps:
                    continue  # the control's slices are used once each
                exact[name].append(said)
                under_test = arm(name, i, i, "speculative")[0]
                control = arm(name, (i + 1) % reps, i, "lossy control")[0]
                lossy[name].append(verdict([plain, under_test, control], a.alpha, rule)[0])
        mean_top = sum(tops) / len(tops)
        print(f"{cell}: mean p(top) {mean_top:.4f}; found with 80% power at these positions (most runs): "
              f"{max(set(res), key=res.count)}")
        lo, hi = binomial_interval(false_alarms, exact_runs)
        for name in LOSSY:
            e, v = exact[name], lossy[name]
            plo, phi = binomial_interval(v.count("NOT LOSSLESS"), len(v))
            rows.append((cell, f"{mean_top:.3f}", name, f"{false_alarms}/{exact_runs} [{lo:.2f}, {hi:.2f}]",
                         f"{e.count('LOSSLESS')}/{len(e)}", f"{v.count('NOT LOSSLESS')}/{len(v)} [{plo:.2f}, {phi:.2f}]",
                         f"{v.count('LOSSLESS')}/{len(v)}"))
    print(f"\nfamily-wise level {a.alpha}; Clopper-Pearson 95% intervals in brackets")
    print("| cell | mean p(top) | control L | exact sampling: NOT LOSSLESS (false alarm) | exact, --control L: "
          "LOSSLESS | L as the sampler: NOT LOSSLESS (power) | L as the sampler: LOSSLESS (wrong) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")
    print(f"\nengine sampling and scoring, all cells: {wall:.0f} s ({wall / 60:.1f} min)")


def simulate(a) -> None:
    """verify's verdict on simulated policies, many repetitions (no engine; minutes on one core)."""
    import torch

    from spectool.commands.verify import ArmResult, LogprobRule, token_tests, verdict
    from spectool.simulated import markov_policy, policy_terms, sample_policy
    from spectool.stats.distributions import binomial_interval
    from spectool.stats.lossless import policy_test

    torch.set_num_threads(1)  # small ops: one thread is faster, and ~100x faster on a loaded machine
    t0 = time.perf_counter()
    rule = LogprobRule("float32", "max", 1e-3, why="simulated arms: no engine logprobs")
    print(f"simulated policy, 1 prompt x {a.sim_samples} completions x {a.positions} positions per run, "
          f"{a.sim_reps} runs per cell, family-wise level {a.alpha}")
    print("| chain scale | mean p(top) | control L | exact sampling: NOT LOSSLESS (false alarm) | exact, --control L: "
          "LOSSLESS | L as the sampler: NOT LOSSLESS (power) | L as the sampler: LOSSLESS (wrong) |")
    print("|---|---|---|---|---|---|---|")
    for scale in (1.0, 8.0, 30.0, 60.0):
        chain = markov_policy(scale)
        g = torch.Generator().manual_seed(2)

        def arm(sampler: str, plain_per=None):
            per = sample_policy(chain, a.sim_samples, a.positions, sampler, g)[2]
            r = ArmResult(sampler, sampler, a.sim_samples * a.positions, policy_test(policy_terms(chain, per)), 0.0,
                          0.0, float("nan"))
            if plain_per is not None:
                r.token_tests = token_tests([per], [plain_per], a.positions, a.alpha / (2 + a.positions))
            return r, per

        exact, lossy, tops, false_alarms = {s: [] for s in LOSSY[:3]}, {s: [] for s in LOSSY[:3]}, [], 0
        for _ in range(a.sim_reps):
            plain, per = arm("exact")
            spec = arm("exact", per)[0]
            tops.append(spec.policy.mean_top)
            for s in exact:
                control, under_test = arm(s, per)[0], arm(s, per)[0]
                control.control = s
                said = verdict([plain, spec, control], a.alpha, rule)[0]
                false_alarms += s == LOSSY[0] and said == "NOT LOSSLESS"
                exact[s].append(said)
                lossy[s].append(verdict([plain, under_test, control], a.alpha, rule)[0])
        lo, hi = binomial_interval(false_alarms, a.sim_reps)
        for s in exact:
            v = lossy[s]
            plo, phi = binomial_interval(v.count("NOT LOSSLESS"), len(v))
            print(f"| {scale:g} | {sum(tops) / len(tops):.3f} | {s} | {false_alarms}/{a.sim_reps} [{lo:.3f}, {hi:.3f}] | "
                  f"{exact[s].count('LOSSLESS')}/{a.sim_reps} | {v.count('NOT LOSSLESS')}/{len(v)} [{plo:.2f}, {phi:.2f}] "
                  f"| {v.count('LOSSLESS')}/{len(v)} |", flush=True)
    print(f"wall time {time.perf_counter() - t0:.0f} s")


def edge(a) -> None:
    """The computed-power rule at its hardest (issue 55, M3): the 10%-hotter sampler as the speculative arm,
    `--control temperature` an independent sample of it, on the simulated chain at scale 1 (mean p(top) 0.10), at
    sizes from the old rule's edge (computed power ~0.85) to the new rule's (~0.994). Every LOSSLESS is wrong; the old
    rule's verdict (power >= 0.8) on the same runs, for comparison."""
    import torch

    from spectool.commands import verify
    from spectool.simulated import markov_policy, policy_terms, sample_policy
    from spectool.stats.distributions import binomial_interval
    from spectool.stats.lossless import ALTERNATIVES, policy_test

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rule = verify.LogprobRule("float32", "max", 1e-3, why="simulated arms: no engine logprobs")
    hotter = ALTERNATIVES.index(("temperature", 1.1))
    alpha_each = a.alpha / (2 + a.positions)
    print(f"simulated chain scale 1, 1 prompt x N completions x {a.positions} positions, {a.sim_reps} runs a cell, "
          f"family-wise level {a.alpha}; the 1.1 T sampler as the speculative arm, --control temperature")
    print("| completions N | computed power vs 1.1 T (median, 10-90%) | NOT LOSSLESS | LOSSLESS (wrong) | "
          "INCONCLUSIVE | the old rule (power >= 0.8): LOSSLESS (wrong) |")
    print("|---|---|---|---|---|---|")
    chain = markov_policy(1.0)
    for n in a.edge_samples:
        g = torch.Generator().manual_seed(7)

        def arm(sampler: str, plain_per=None):
            per = sample_policy(chain, n, a.positions, sampler, g)[2]
            r = verify.ArmResult(sampler, sampler, n * a.positions, policy_test(policy_terms(chain, per)), 0.0, 0.0,
                                 float("nan"))
            if plain_per is not None:
                r.token_tests = verify.token_tests([per], [plain_per], a.positions, alpha_each)
            return r, per

        said, old, powers = [], [], []
        for _ in range(a.sim_reps):
            plain, per = arm("exact")
            under_test, control = arm("temperature", per)[0], arm("temperature", per)[0]
            control.control = "temperature"
            said.append(verify.verdict([plain, under_test, control], a.alpha, rule)[0])
            powers.append(under_test.policy.power(alpha_each)[hotter])
            power, verify.POWER = verify.POWER, 0.8  # the rule before issue 55, on the same runs
            try:
                old.append(verify.verdict([plain, under_test, control], a.alpha, rule)[0])
            finally:
                verify.POWER = power
        powers.sort()
        k = said.count("LOSSLESS")
        lo, hi = binomial_interval(k, len(said))
        ko = old.count("LOSSLESS")
        olo, ohi = binomial_interval(ko, len(old))
        print(f"| {n} | {powers[len(powers) // 2]:.3f} ({powers[len(powers) // 10]:.3f}-"
              f"{powers[9 * len(powers) // 10]:.3f}) | {said.count('NOT LOSSLESS')} | {k}/{len(said)} "
              f"[{lo:.3f}, {hi:.3f}] | {said.count('INCONCLUSIVE')} | {ko}/{len(old)} [{olo:.3f}, {ohi:.3f}] |",
              flush=True)
    print(f"wall time {time.perf_counter() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("sample", "report", "simulate", "edge"))
    ap.add_argument("--cell", choices=tuple(CELLS), help="sample: the cell to draw")
    ap.add_argument("--draft", help="sample: an EAGLE-3 draft folder of SmolLM2 (default: the policy drafts itself)")
    ap.add_argument("--out", default="runs/verify-cal")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--positions", type=int, default=6)
    ap.add_argument("--samples", type=int, default=25, help="completions per prompt in one repetition")
    ap.add_argument("--reps-exact", type=int, default=8, help="repetitions of the exact samplers (and the control)")
    ap.add_argument("--reps-lossy", type=int, default=6, help="repetitions of each other lossy sampler")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alpha", type=float, default=0.01, help="report, simulate: verify's family-wise level")
    ap.add_argument("--sim-reps", type=int, default=300, help="simulate: runs per cell")
    ap.add_argument("--sim-samples", type=int, default=100, help="simulate: completions per run")
    ap.add_argument("--edge-samples", type=int, nargs="+", default=[700, 1000, 1350],
                    help="edge: completions per run, one cell each")
    a = ap.parse_args()
    if a.what == "sample":
        if not a.cell:
            ap.error("sample needs --cell")
        sample(a)
    elif a.what == "report":
        report(a)
    elif a.what == "edge":
        edge(a)
    else:
        simulate(a)


if __name__ == "__main__":
    main()
