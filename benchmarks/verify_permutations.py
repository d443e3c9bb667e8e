"""The cost of verify's token tests for one lossy control (issue 55, M4), on simulated counts (no engine, no model):
`prompts` x `positions` chi-square tests of the control's j-th tokens against plain decoding's, `samples` completions
per prompt and arm (verify's defaults but 64 prompts), each prompt its own simulated chain (spectool.simulated, scale 1:
mean p(top) 0.10) and the control top-p 0.9. A test whose chi-square law p is below 0.01 gets a permutation p-value;
at verify's per-test level alpha / (2 + prompts x positions) that took permutations_for(level) relabellings each.

    PYTHONPATH=src nice -n 19 .venv/bin/python benchmarks/verify_permutations.py --mode verify
    PYTHONPATH=src nice -n 19 .venv/bin/python benchmarks/verify_permutations.py --mode sequential
    PYTHONPATH=src nice -n 19 .venv/bin/python benchmarks/verify_permutations.py --mode fixed --tests 3

`fixed` runs every relabelling (the rule before issue 55) on the first `--tests` tests that need permutations and
extrapolates to all of them; it calls only stats.lossless.token_test(..., permutations=N), so it also runs on the code before
(PYTHONPATH at an older checkout's src). `sequential` resolves every test, each stopped once its p is resolved against
the level. `verify` runs verify's own token tests (commands/verify.token_tests: sequential, and the arm's tests
resolved, smallest chi-square p first, only until one rejects).
"""

from __future__ import annotations

import argparse
import math
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("fixed", "sequential", "verify"), required=True)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--positions", type=int, default=6)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--control", default="truncated", help="a spectool.simulated sampler")
    ap.add_argument("--scale", type=float, default=1.0, help="the chains' logit scale (spectool.simulated)")
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--tests", type=int, help="fixed, sequential: tests timed, then extrapolated (fixed: 3; "
                    "sequential: all)")
    a = ap.parse_args()

    import torch

    from spectool.simulated import markov_policy, sample_policy
    from spectool.stats.lossless import token_test

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    plain, control = [], []
    for p in range(a.prompts):
        chain = markov_policy(a.scale, seed=100 + p)
        plain.append(sample_policy(chain, a.samples, a.positions, "exact", g)[2])
        control.append(sample_policy(chain, a.samples, a.positions, a.control, g)[2])
    level = a.alpha / (2 + a.prompts * a.positions)
    permutations = math.ceil(2 / (level * 0.01))  # verify.permutations_for (RESOLUTION 0.01), before and after
    pairs = [(p, j, [r[j] for r in control[p]], [r[j] for r in plain[p]])
             for p in range(a.prompts) for j in range(a.positions)]
    need = [t for t in pairs if token_test(t[0], t[1] + 1, t[2], t[3], permutations=1).law_p < 0.01]
    print(f"{a.prompts} prompts x {a.positions} positions, {a.samples} completions per prompt and arm, control "
          f"{a.control}: {len(need)} of {len(pairs)} tests need permutations; per-test level {level:.2e}, at most "
          f"{permutations:,} relabellings each", flush=True)
    t0 = time.perf_counter()
    if a.mode == "fixed":
        timed = need[: a.tests or 3]
        rejected = sum(token_test(p, j + 1, x, y, permutations=permutations).p < level for p, j, x, y in timed)
        each = (time.perf_counter() - t0) / max(len(timed), 1)
        print(f"fixed: {each:.2f} s per test ({rejected} of {len(timed)} timed rejected); all {len(need)}: "
              f"~{each * len(need):.0f} s ({each * len(need) / 60:.1f} min, extrapolated)")
    elif a.mode == "sequential":
        timed = need[: a.tests or len(need)]
        rejected = sum(token_test(p, j + 1, x, y, permutations=permutations, level=level).p < level
                       for p, j, x, y in timed)
        each = (time.perf_counter() - t0) / max(len(timed), 1)
        print(f"sequential: {each:.2f} s per test ({rejected} of {len(timed)} timed rejected); all {len(need)}: "
              f"~{each * len(need):.0f} s ({each * len(need) / 60:.1f} min{', extrapolated' if a.tests else ''})")
    else:
        from spectool.commands.verify import token_tests

        tests = token_tests(control, plain, a.positions, level)
        spent = time.perf_counter() - t0
        print(f"verify.token_tests: {len(tests)} tests in {spent:.1f} s; {sum(t.p < level for t in tests)} rejected, "
              f"{sum(not t.resolved for t in tests)} left unresolved")

if __name__ == "__main__":
    main()
