"""Mutation score of the decision code: the audit's 19 mutants (../shared/reviews/audit-2026-11c.md, "Mutation
table"), each applied alone to a copy of the working tree and run against the tests most likely to catch it.

A mutant is killed when pytest reports a failed or errored test; the suite's own budget verdict (tests/costs.py) is
not a kill. The working tree is never written: each mutant runs in a scratch copy of src/ and tests/ (the copy's
src first on PYTHONPATH), so it can run beside other work.

    .venv/bin/python benchmarks/mutation.py                 # all 19, their targeted unit tests (96 s here)
    .venv/bin/python benchmarks/mutation.py P1 P3 --all-unit  # those mutants against every unit test
    .venv/bin/python benchmarks/mutation.py --out benchmarks/data/mutation_<date>.json  # 2026-11-28: 19/19, 96 s

Exit status: 0 when every mutant run was killed, 1 when one survived, 2 when a mutant no longer applies (its
`old` text is not in the source exactly once: the code moved, so the mutant must be rewritten, not skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNIT = "not engine and not e2e and not multiproc"  # the tiers' cost markers: no engine, no CLI pipeline, one process
SWEEP = ("tests/test_sweep.py",)
REFRESH = ("tests/test_refresh_policy.py",)
LOSSLESS = ("tests/test_lossless.py",)
IDENTITY = ("tests/test_feature_identity.py", "tests/test_features.py", "tests/test_init_draft_scale.py")
MEMORY = ("tests/test_init_draft_memory.py", "tests/test_memory_plan.py")
BATCH = ("tests/test_engine_batch.py", "tests/test_gpu_build.py", "tests/test_compat.py")


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str  # under the repository root
    old: str  # the source text replaced: exactly once in `path`
    new: str
    tests: tuple[str, ...]
    what: str


MUTANTS = (
    Mutant("S1", "src/spectool/stats/sweep.py", "q = student_t_quantile(1 - alpha / arms, df)",
           "q = student_t_quantile(1 - alpha, df)", SWEEP, "Bonferroni over arms dropped"),
    Mutant("S2", "src/spectool/stats/sweep.py", "q = student_t_quantile(1 - alpha / arms, df)",
           "q = student_t_quantile(1 - alpha / arms, df + 1)", SWEEP, "t quantile on R df, not R - 1"),
    Mutant("S3", "src/spectool/stats/sweep.py", "/ (df * rounds)) if df", "/ (rounds * rounds)) if df", SWEEP,
           "sd(d) with the biased (1/R) variance"),
    Mutant("R1", "src/spectool/stats/refresh.py", "sd * math.sqrt(crc / (1 - rho)) / sxx", "sd / math.sqrt(sxx)",
           REFRESH, "slope se for independent steps (AR(1) sandwich dropped)"),
    # the audit's R2 (df without its (1 - rho) / (1 + rho) scaling) on von Neumann's df under AR(1) steps since its M4
    Mutant("R2", "src/spectool/stats/refresh.py", "return m * m / (m + (1 - rho) ** 2 / 2 * spread)",
           "return 2 * m * m / (3 * m - 1)", REFRESH, "von Neumann's df without rho (independent steps')"),
    Mutant("R3", "src/spectool/stats/refresh.py", "crc += 2 * rho**lag * sum", "crc += rho**lag * sum", REFRESH,
           "c'Rc misses the factor 2 (one side of the band)"),
    Mutant("P1", "src/spectool/stats/lossless.py",
           "return min(1.0, binomial_bound(hits, done, each, upper=True) + risk)",
           "return min(1.0, (1 + hits) / (1 + done))", LOSSLESS,
           "sequential p: the naive estimate at the stopping look"),
    Mutant("P2", "src/spectool/stats/lossless.py", "each = risk / len(looks)", "each = risk", LOSSLESS,
           "sequential p: no union over the looks"),
    Mutant("P3", "src/spectool/stats/lossless.py", "return min(1.0, math.exp(-log_mean))",
           "return min(1.0, math.exp(-top))", LOSSLESS, "mixture p: the best alternative's 1/LR (no 1/G)"),
    Mutant("V1", "src/spectool/commands/verify.py", "POWER = normal_cdf(POWER_Z)", "POWER = 0.8", LOSSLESS,
           "computed power standard back at 0.8"),
    Mutant("F1", "src/spectool/features.py", "diff = sorted(k for k in want if have.get(k) != want[k])",
           "diff = sorted(k for k in want if k != \"lengths\" and have.get(k) != want[k])", IDENTITY,
           "a shard's lengths not compared"),
    Mutant("F2", "src/spectool/commands/init_draft_inputs.py", "identity = {\"harvest\": data.identity, ", "identity = {",
           IDENTITY, "the features' identity without the harvest's"),
    Mutant("F3", "src/spectool/commands/init_draft.py", "if recorded not in (None, data.identity):",
           "if recorded not in (None, data.identity, recorded):", IDENTITY, "a resume over a changed harvest not refused"),
    Mutant("F4", "src/spectool/features.py",
           "for p in sorted((Path(run_dir) / \"hidden\").glob(\"shard-*.safetensors\")):", "for p in []:", IDENTITY,
           "harvest identity ignores its --hidden-states shards"),
    Mutant("M1", "src/spectool/memory.py", "return min(batch_size * longest, max(max_batch_tokens, longest))",
           "return min(batch_size * longest, max_batch_tokens)", MEMORY,
           "a record longer than --max-batch-tokens not alone"),
    # the audit's M2 ("attention scores of one record, not the micro-batch") mutated the T x T scores row, gone since
    # the fused attention (issue 60): its counterpart now is the fused attention counted for one unroll step
    Mutant("M2", "src/spectool/memory.py", "return int(tokens * (kept * d.steps * d.layers",
           "return int(tokens * (kept * d.layers", MEMORY, "fused attention of one unroll step, not every step"),
    Mutant("B1", "src/spectool/engine/batch.py", "seqs = min(batch or seqs_default, seqs_default, tokens)",
           "seqs = min(batch or seqs_default, tokens)", BATCH, "no cap at vLLM's per-device default"),
    Mutant("B2", "src/spectool/engine/batch.py", "fit = batched_tokens // (slots + 1 + k)",
           "fit = batched_tokens // (1 + k)", BATCH, "a caller's budget: draft slots not counted"),
    Mutant("B3", "src/spectool/engine/compat.py", "and \"a100\" not in device_name.lower()", "", BATCH,
           "A100s get the large-GPU defaults"),
)


def stale(mutants: tuple[Mutant, ...], root: Path = ROOT) -> list[str]:
    """The mutants whose `old` text is not in their file exactly once ("ID: PATH has it N times")."""
    out = []
    for m in mutants:
        n = (root / m.path).read_text().count(m.old)
        if n != 1:
            out.append(f"{m.id}: {m.path} has its text {n} times")
    return out


def scratch_copy() -> Path:
    """src/, tests/ and the files pytest reads, copied from the working tree (uncommitted changes included)."""
    where = Path(tempfile.mkdtemp(prefix="spectool-mutation-"))
    for name in ("src", "tests"):
        shutil.copytree(ROOT / name, where / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest-costs"))
    for name in ("pyproject.toml", "conftest.py"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, where / name)
    return where


def run_tests(where: Path, files: tuple[str, ...]) -> tuple[list[str], str, float]:
    """(failed or errored test ids, pytest's summary line, seconds) of `files` in the copy, unit tests only."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--tier", "full",
                        "-m", UNIT, *files], cwd=where, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                            "PYTHONPATH": str(where / "src")})
    out = r.stdout + r.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    summary = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return failed, (summary[-1] if summary else out[-300:]), time.perf_counter() - t


def run(mutant: Mutant, where: Path, files: tuple[str, ...]) -> dict:
    """One mutant applied in the copy, its tests run, the file restored."""
    path = where / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.old, mutant.new))
    try:
        failed, summary, seconds = run_tests(where, files)
    finally:
        path.write_text(original)
    line = original[:original.index(mutant.old)].count("\n") + 1
    return {"id": mutant.id, "where": f"{mutant.path.removeprefix('src/spectool/')}:{line}", "what": mutant.what,
            "killed_by": failed[0] if failed else None, "seconds": round(seconds, 1), "pytest": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help="mutant ids (default: all)")
    ap.add_argument("--all-unit", action="store_true", help="run every unit test of tests/, not the targeted files")
    ap.add_argument("--out", type=Path, help="write the rows and the score as JSON here")
    args = ap.parse_args(argv)
    unknown = set(args.ids) - {m.id for m in MUTANTS}
    if unknown:
        ap.error(f"unknown mutant ids {sorted(unknown)}; known: {' '.join(m.id for m in MUTANTS)}")
    chosen = tuple(m for m in MUTANTS if not args.ids or m.id in args.ids)
    if problems := stale(chosen):
        print("mutants that no longer apply (rewrite them for the code as it is now):\n  " + "\n  ".join(problems))
        return 2
    where = scratch_copy()
    rows = []
    try:
        for m in chosen:
            row = run(m, where, ("tests",) if args.all_unit else m.tests)
            rows.append(row)
            verdict = f"killed by {row['killed_by']}" if row["killed_by"] else "SURVIVED"
            print(f"{row['id']:3} {row['where']:34} {row['what'][:52]:52} {verdict} ({row['seconds']:.0f} s)", flush=True)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    killed = sum(r["killed_by"] is not None for r in rows)
    print(f"mutation score: {killed}/{len(rows)} killed")
    if args.out:
        args.out.write_text(json.dumps({"score": f"{killed}/{len(rows)}", "all_unit": args.all_unit, "rows": rows},
                                       indent=1) + "\n")
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
