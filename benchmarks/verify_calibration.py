"""Calibration of `spectool verify`'s verdict on the real engine (issue 49): how often exact sampling is called
NOT LOSSLESS (the false-alarm rate, at most the family-wise level) and how often each lossy sampler is (the power),
from high entropy to a near-deterministic policy, with Clopper-Pearson 95% intervals.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/verify_calibration.py sample --cell t1
    flock /tmp/heavy.lock .venv/bin/python benchmarks/verify_calibration.py sample --cell t03
    flock /tmp/heavy.lock .venv/bin/python benchmarks/verify_calibration.py sample --cell sharp8
    .venv/bin/python benchmarks/verify_calibration.py report          # the table, from the scored pools (no engine)

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
verify runs of S samples per prompt, and a rate over them is a binomial proportion. In repetition i
 - exact sampling: verify.verdict(plain_i, speculative_i, control unpatched_i), the run `verify` makes by default on
   the CPU build;
 - each lossy sampler L: verify.verdict(plain_i, L_i in the speculative arm's place, control unpatched_(i+1)): what
   verify says of a sampler that is L. The plain slice is shared by these verdicts: each sees what a real run would,
   so each rate is unbiased; the rates of different samplers in one cell are correlated.
"""

from __future__ import annotations

import argparse
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

    from spectool.commands.verify import _arm_result, logprob_rule, verdict
    from spectool.config import VerifyConfig
    from spectool.engine.arms import LOSSY_CONTROLS
    from spectool.stats import binomial_interval

    cfg = VerifyConfig(alpha=a.alpha)
    rule = logprob_rule(cfg)
    rows, wall = [], 0.0
    for cell in CELLS:
        folder = Path(a.out) / cell
        if not all((folder / f"{n}.pt").exists() for n in EXACT + LOSSY):
            print(f"{cell}: not sampled yet", file=sys.stderr)
            continue
        pools = {n: torch.load(folder / f"{n}.pt", weights_only=False) for n in EXACT + LOSSY}
        wall += sum(p["sample_s"] + p["score_s"] for p in pools.values())
        positions = max(len(r) for rs in pools["plain"]["responses"] for r in rs)

        def arm(name: str, i: int, plain_part: dict | None, label: str):
            part, scored = _slice(pools[name], i)
            return _arm_result(label, LOSSY_CONTROLS.get(name, name), part, scored, plain_part, positions), part

        said = {n: [] for n in ("exact", *LOSSY)}
        tops, resolution = [], []
        for i in range(pools["plain"]["reps"]):
            plain, plain_part = arm("plain", i, None, "plain")
            control = arm("unpatched", i, plain_part, "lossy control")[0]
            spec = arm("speculative", i, plain_part, "speculative")[0]
            v = verdict([plain, spec, control], a.alpha, rule)
            said["exact"].append(v[0])
            tops.append(spec.policy.mean_top)
            resolution.append(spec.policy.detectable(v[2]))
            for name in LOSSY:
                if i >= pools[name]["reps"]:
                    continue
                lossy = arm(name, i, plain_part, "speculative")[0]
                other = arm("unpatched", (i + 1) % pools["unpatched"]["reps"], plain_part, "lossy control")[0]
                said[name].append(verdict([plain, lossy, other], a.alpha, rule)[0])
        mean_top = sum(tops) / len(tops)
        common = max(set(map(str, resolution)), key=lambda r: list(map(str, resolution)).count(r))
        print(f"{cell}: mean p(top) {mean_top:.4f}; most common resolution at 80% power: {common}")
        for name, verdicts in said.items():
            n, bad = len(verdicts), verdicts.count("NOT LOSSLESS")
            lo, hi = binomial_interval(bad, n)
            rows.append((cell, f"{mean_top:.3f}", name, f"{bad}/{n}", f"{lo:.2f}-{hi:.2f}",
                         verdicts.count("LOSSLESS"), verdicts.count("INCONCLUSIVE")))
    print(f"\nfamily-wise level {a.alpha}; NOT LOSSLESS on exact sampling is a false alarm, on a lossy sampler its "
          "power (Clopper-Pearson 95%)")
    print("| cell | mean p(top) | sampler | NOT LOSSLESS | 95% interval | LOSSLESS | INCONCLUSIVE |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")
    print(f"\nengine sampling and scoring, all cells: {wall:.0f} s ({wall / 60:.1f} min)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("sample", "report"))
    ap.add_argument("--cell", choices=tuple(CELLS), help="sample: the cell to draw")
    ap.add_argument("--draft", help="sample: an EAGLE-3 draft folder of SmolLM2 (default: the policy drafts itself)")
    ap.add_argument("--out", default="runs/verify-cal")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--positions", type=int, default=6)
    ap.add_argument("--samples", type=int, default=25, help="completions per prompt in one repetition")
    ap.add_argument("--reps-exact", type=int, default=12, help="repetitions of the exact samplers (and the control)")
    ap.add_argument("--reps-lossy", type=int, default=8, help="repetitions of each other lossy sampler")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alpha", type=float, default=0.01, help="report: verify's family-wise level")
    a = ap.parse_args()
    if a.what == "sample":
        if not a.cell:
            ap.error("sample needs --cell")
        sample(a)
    else:
        report(a)


if __name__ == "__main__":
    main()
