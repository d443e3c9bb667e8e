"""Mutation score of the decision code: the audit's 19 mutants (../shared/reviews/audit-2026-11c.md, "Mutation
table") and 33 of the code added on 2026-11-27/28 (issue 68 item 9: the context, prompts, the draft's attention and
packing, trackers, the weights digest, TRL's preflight and attach, export and its card, ranks, the speculators
reading), 4 of the evening's (arms forked from a forkserver, the engine log's routing in a forked process), 4 of
2026-11-29's (the forkserver's warm-up: one thread, the count restored, the heap frozen, the random state kept),
each applied alone to a copy of the working tree and run against the tests most likely to catch it.

A mutant is killed when pytest reports a failed or errored test, and that test passes again once the mutant is
taken out (a test that fails on the code as it is kills nothing: the mutant is reported as not scored); the suite's
own budget verdict (tests/costs.py) is not a kill. The working tree is never written: each mutant runs in a scratch
copy of it (the files git lists, uncommitted changes included; the copy's src first on PYTHONPATH, so its code is
what the tests import), so it can run beside other work. CPU heavy: run it under `nice`.

    .venv/bin/python benchmarks/mutation.py                 # all of them, each against its targeted unit tests
    .venv/bin/python benchmarks/mutation.py P1 P3 --all-unit  # those mutants against every unit test
    .venv/bin/python benchmarks/mutation.py K1 --tests tests/test_micro_batches.py  # against the tests named
    .venv/bin/python benchmarks/mutation.py --out benchmarks/data/mutation_<date>.json  # the score, the command, the code

Exit status: 0 when every mutant run was killed, 1 when one survived, 2 when a mutant no longer applies (its
`old` text is not in the source exactly once: the code moved, so the mutant must be rewritten, not skipped) or
a killing test also fails without its mutant.
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
# the 2026-11-27/28 round's code (issue 68 item 9): each group the unit tests of that code
ATTENTION = ("tests/test_draft_attention.py",)
PACKING = ("tests/test_micro_batches.py", "tests/test_draft_attention.py", "tests/test_refresh.py")
TRACKERS = ("tests/test_trackers.py",)
DIGEST = ("tests/test_feature_identity.py",)
TRL = ("tests/test_trl_engine_budget.py", "tests/test_trl_draft_range.py", "tests/test_preflight.py",
       "tests/test_data.py::test_every_command_reads_the_columns_it_is_given")
EXPORT = ("tests/test_export_portable.py", "tests/test_export_share.py", "tests/test_export_speculators.py")
RANKS = ("tests/test_shared_run_folder.py", "tests/test_harvest_parallel.py")
SPECULATORS = ("tests/test_warm_start_speculators.py",)
CONTEXT = ("tests/test_context.py",)
PROMPTS = ("tests/test_prompts.py",)
# the 2026-11-28 evening round: arms forked from a forkserver, the engine log's routing in a forked process
FORKS = ("tests/test_subproc.py",)
LOGS = ("tests/test_logs.py",)
PREFORK = ("tests/test_prefork.py",)
SETTINGS = ("tests/test_settings.py", "tests/test_cli.py")


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

MODEL, TTT, TRACK = "src/spectool/draft/model.py", "src/spectool/draft/ttt.py", "src/spectool/trackers.py"
# the code added on 2026-11-27/28 (issue 68 item 9): the context, prompts, the draft's attention and packing, trackers,
# the weights digest, TRL's preflight and attach, export and its card, ranks, the speculators reading
NEW_MUTANTS = (
    Mutant("A1", MODEL, "r = torch.searchsorted(bounds, every, right=True) - 1",
           "r = torch.searchsorted(bounds, every, right=False) - 1", ATTENTION,
           "a packed record's first position counted in the record before"),
    Mutant("A2", MODEL, "idx[a:b] - s0,", "idx[a:b] - a,", ATTENTION,
           "a packed record's anchors shifted by its first query, not its first key"),
    Mutant("A3", MODEL, "else o.index_select(2, rows + m)", "else o.index_select(2, rows)", ATTENTION,
           "sampled anchors read the output rows m before their own"),
    Mutant("A4", MODEL, "extra.to(q.dtype).clamp_min(low)", "extra.to(q.dtype)", ATTENTION,
           "a masked extra key's -inf score not made finite"),
    Mutant("A5", MODEL, "o = F.scaled_dot_product_attention(qx, k, v, is_causal=True, scale=1.0, enable_gqa=gqa)",
           "o = F.scaled_dot_product_attention(qx, k, v, attn_mask=torch.ones(m + T, m + T, dtype=torch.bool, "
           "device=q.device).tril(), scale=1.0, enable_gqa=gqa)",
           (*ATTENTION, "tests/test_claims.py::test_the_draft_attention_never_builds_a_tensor_quadratic_in_the_sequence"),
           "the attention's [L, L] mask materialised (quadratic memory, same numbers)"),
    Mutant("K1", TTT, "if out and total + lengths[i] <= max_tokens:", "if out and total + lengths[i] < max_tokens:",
           PACKING, "a record that fills the micro-batch exactly starts another"),
    Mutant("K2", TTT, "response = [n - p for n, p in zip(lengths, prompt_lens)]", "response = list(lengths)", PACKING,
           "micro-batches weighted by all their tokens, not their response tokens"),
    Mutant("K3", TTT, "if sum(lengths) <= max_tokens:", "if max(lengths) <= max_tokens:", PACKING,
           "a batch whose records each fit taken whole past max_tokens"),
    Mutant("K4", TTT, "(t[None, :] <= hi - 2)", "(t[None, :] <= hi - 1)", PACKING,
           "a record's last position, which no loss reads, sampled as an anchor"),
    Mutant("T1", TRACK, "purge_step=start + 1)", "purge_step=start)", TRACKERS,
           "a resume purges the checkpoint's own step from TensorBoard"),
    Mutant("T2", TRACK, "if step >= first:  # a step the run holds", "if step > first:  # a step the run holds",
           TRACKERS, "a resumed trackio run skips its first new step"),
    Mutant("T3", TRACK, "path = Path(out).resolve()", "path = Path(out)", TRACKERS,
           "a run folder named relatively is another tracker run"),
    Mutant("T4", TRACK, "    if not main:\n        return Trackers([])", "    if main is None:\n        return Trackers([])",
           TRACKERS, "every process of a launch logs, not the main one alone"),
    Mutant("T5", TRACK, "return list(dict.fromkeys(names))", "return names", TRACKERS,
           "a tracker named twice opened twice"),
    Mutant("D1", "src/spectool/models.py", "return [i * (size - WINDOW_BYTES) // (n - 1) for i in range(n)]",
           "return [i * size // (n - 1) for i in range(n)]", DIGEST,
           "the digest's last window starts at the tensor's end (reads nothing)"),
    Mutant("D2", "src/spectool/models.py", "p.name, 8 + n + a, b - a))", "p.name, 8 + a, b - a))", DIGEST,
           "tensor offsets read from the file's start, not past its header"),
    Mutant("D3", "src/spectool/models.py", "h.update(json.dumps([k, dtype, shape]).encode())",
           "h.update(json.dumps([k, shape]).encode())", DIGEST, "a tensor's dtype not in the digest"),
    Mutant("D4", "src/spectool/features.py",
           "made_by = (f.metadata() or {}).get(\"model_weights\", manifest.get(\"model_weights\"))",
           "made_by = manifest.get(\"model_weights\")", DIGEST,
           "a hidden-state shard's own weights digest ignored for the manifest's"),
    Mutant("X1", "src/spectool/integrations/trl/attach.py",
           "kwargs[\"max_num_batched_tokens\"] = max(kwargs[\"max_num_batched_tokens\"], context)",
           "kwargs[\"max_num_batched_tokens\"] = min(kwargs[\"max_num_batched_tokens\"], context)", TRL,
           "TRL's CPU step budget lowered to the context, not raised"),
    Mutant("X2", "src/spectool/integrations/trl/preflight.py",
           "user=getattr(args, \"vllm_max_model_length\", None), names=names,", "user=None, names=names,", TRL,
           "TRL's vllm_max_model_length not checked against its lengths"),
    Mutant("X3", "src/spectool/integrations/trl/preflight.py",
           "draft_path=None if mtp or spec.draft is None else str(spec.draft),", "draft_path=None,", TRL,
           "TRL's lengths not checked against the draft's position range"),
    Mutant("E1", "src/spectool/commands/export.py", "    if \"/\" in base:\n        return note",
           "    if base:\n        return note", EXPORT, "a card naming a local folder's name, not a hub id, not flagged"),
    Mutant("E2", "src/spectool/commands/export_card.py", "name.endswith((\".jsonl\", \".parquet\"))",
           "name.endswith(\".jsonl\")", EXPORT, "the card shows a parquet file's local path"),
    Mutant("E3", "src/spectool/commands/export.py",
           "dtype = policy_cfg.get(\"dtype\") or policy_cfg.get(\"torch_dtype\")",
           "dtype = policy_cfg.get(\"torch_dtype\")", EXPORT,
           "a transformers-5 config's dtype ignored (speculators export in float32)"),
    Mutant("E4", "src/spectool/commands/export.py", "v.to(dt) if v.is_floating_point() else v", "v.to(dt)", EXPORT,
           "the speculators export casts d2t/t2d ids to the verifier's dtype"),
    Mutant("N1", "src/spectool/ranks.py", "if 0 not in views[r][0] or r not in views[0][0]]",
           "if 0 not in views[r][0]]", RANKS, "a rank whose mark the main process does not see passes"),
    Mutant("N2", "src/spectool/ranks.py", "    if wrote:\n        mine.unlink", "    if not wrote:\n        mine.unlink",
           RANKS, "the ranks' marks left in the run folder"),
    Mutant("N3", "src/spectool/ranks.py", "result = together(claim, main_only=True)",
           "result = together(claim, main_only=False)", RANKS, "every rank claims the run folder"),
    Mutant("Q1", "src/spectool/draft/checkpoint.py", "\"norm_before_residual\": c.get(\"norm_before_residual\", True)}",
           "\"norm_before_residual\": c.get(\"norm_before_residual\", False)}", SPECULATORS,
           "a speculators config without norm_before_residual read as false"),
    Mutant("Q2", "src/spectool/draft/checkpoint.py", "on = [k for k in SPECULATORS_REFUSED if c.get(k)]",
           "on = [k for k in SPECULATORS_REFUSED if k in c]", SPECULATORS,
           "a speculators option set to false refused"),
    Mutant("C1", "src/spectool/context.py", "key = min(found, key=found.get)", "key = max(found, key=found.get)",
           CONTEXT, "the model's limit from its largest length key, not its smallest"),
    Mutant("C2", "src/spectool/context.py", "if kind and kind not in _PRESCALED_ROPE and kind != \"default\"",
           "if kind and kind != \"default\"", CONTEXT, "a prescaled rope's factor applied again"),
    Mutant("PR1", "src/spectool/prompts.py", "return [{\"role\": \"system\", \"content\": system_prompt}, *messages]",
           "return [*messages, {\"role\": \"system\", \"content\": system_prompt}]", PROMPTS,
           "--system-prompt put after the data's turns"),
    Mutant("FK1", "src/spectool/subproc.py", "    os.environ.clear()\n    os.environ.update(env)\n", "", FORKS,
           "a forked arm keeps the forkserver's environment, not the caller's at the call"),
    Mutant("FK3", "src/spectool/subproc.py", "                progress(line[len(PROGRESS):].rstrip())",
           "                pass", FORKS, "a child's progress lines dropped"),
    Mutant("LG1", "src/spectool/engine/logs.py", "    if _OPEN != str(path):",
           "    if os.environ.get(ENV) != str(path):", LOGS,
           "routing trusts the environment: a forked process keeps writing vLLM's lines to stderr"),
    Mutant("LG2", "src/spectool/engine/logs.py", "        envs.disable_envs_cache()", "        pass", LOGS,
           "vLLM's frozen environment kept: the stream just set is not read"),
    Mutant("PF1", "src/spectool/engine/prefork.py", "    torch.set_num_threads(1)\n", "", PREFORK,
           "the warm-up runs at the process's thread count: an OpenMP team may exist when the process forks"),
    Mutant("PF2", "src/spectool/engine/prefork.py", "        torch.set_num_threads(threads)\n", "", PREFORK,
           "the thread count not restored: every forked engine decodes on one thread"),
    Mutant("PF3", "src/spectool/engine/prefork.py", "    gc.freeze()\n", "", PREFORK,
           "the heap not frozen: every collection in a forked engine walks the forkserver's imports again"),
    Mutant("PF4", "src/spectool/engine/prefork.py", "with torch.random.fork_rng(devices=[]), torch.inference_mode():",
           "with torch.inference_mode():", PREFORK, "the warm-up draws from torch's random state and leaves it moved"),
    Mutant("ST1", "src/spectool/cli.py", "                cfg.validate()  # before the command's module imports torch and vLLM",
           "                pass  # before the command's module imports torch and vLLM", SETTINGS,
           "a refused setting found only after the command imported torch and vLLM"),
    Mutant("ST2", "src/spectool/cli.py", "values.update({p: v for p, v in from_file.items() if p not in given})",
           "values.update(from_file)", SETTINGS, "--config FILE over the flags given on the command line"),
    Mutant("ST3", "src/spectool/settings/engine.py", "    out.pop(\"max_model_len\", None)\n",
           "    out.pop(\"max_model_len\", None)\n    out.pop(\"enforce_eager\", None)\n", SETTINGS,
           "an engine setting that does not reach the engine (EngineConfig falls back to its own default)"),
    Mutant("ST4", "src/spectool/rl/config.py", "engine.get(\"max_model_len\") == 0:", "engine.get(\"max_model_len\") == -1:",
           SETTINGS, "an older rl.yaml's engine.max_model_len: 0 (derived) refused"),
    Mutant("ST5", "src/spectool/cli.py", "    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):",
           "    for klass in [k for k in cls.__mro__ if dataclasses.is_dataclass(k)]:", SETTINGS,
           "a group's docstring over the command's own for a field the command restates (verify's float32 dtype)"),
    Mutant("ST6", "src/spectool/cli.py", 'getattr(ctx.get_parameter_source(p), "name", "") == "COMMANDLINE"',
           'ctx.get_parameter_source(p) == __import__("click.core").core.ParameterSource.COMMANDLINE', SETTINGS,
           "flags given compared with click's ParameterSource, not typer's copy: no flag counts as given (a --config "
           "file or an init-draft --preset over the flags)"),
    Mutant("ST7", "src/spectool/rl/config.py", "    \"\"\"false: plain decoding (the draft, if set, is not used).\"\"\"\n",
           "    \"\"\"false: plain decoding (the draft, if set, is not used).\"\"\"\n    k: int | str = 4\n", SETTINGS,
           "an entry point that restates a group's field with a default of its own (rl.yaml's speculation.k drifts "
           "from the commands' --k)"),
    Mutant("ST8", "src/spectool/integrations/trl/settings.py", "        Proposals.validate(self, keyword)\n", "", SETTINGS,
           "SpectoolSpeculation takes the proposals group but not its rule (k=0 reaches the engine)"),
    Mutant("ST9", "src/spectool/settings/groups.py", "            group.validate(settings, spell)",
           "            group.validate(settings)", SETTINGS,
           "a group's rule refused in the command line's spelling at every entry point (rl.yaml's engine.dtype named "
           "--dtype)"),
    Mutant("ST10", "src/spectool/settings/speculation.py", "        check(self.k != \"auto\" or self.sweep is not None",
           "        check(True or self.sweep is not None", SETTINGS,
           "k auto without a sweep taken (rollout and rl.yaml find no schedule once the engine is to start)"),
    Mutant("ST11", "src/spectool/settings/speculation.py", "    check(method in TRAINABLE, spell(\"method\")",
           "    check(method in DRAFTERS, spell(\"method\")", SETTINGS,
           "a served but untrained family (dspark) taken by init-draft and rl.yaml's online refresh"),
)
ALL = MUTANTS + NEW_MUTANTS


def stale(mutants: tuple[Mutant, ...], root: Path = ROOT) -> list[str]:
    """The mutants whose `old` text is not in their file exactly once ("ID: PATH has it N times")."""
    out = []
    for m in mutants:
        n = (root / m.path).read_text().count(m.old)
        if n != 1:
            out.append(f"{m.id}: {m.path} has its text {n} times")
    return out


def scratch_copy() -> Path:
    """The working tree as git sees it (tracked and untracked files, uncommitted changes included; ignored ones such as
    .venv and caches left out), copied: tests read more than src/ and tests/ (benchmarks/data, docs, templates)."""
    where = Path(tempfile.mkdtemp(prefix="spectool-mutation-"))
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is listed, not there
            (where / name).parent.mkdir(parents=True, exist_ok=True)
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
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.M)  # a parametrized id may hold spaces
    summary = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return failed, (summary[-1] if summary else out[-300:]), time.perf_counter() - t


def run(mutant: Mutant, where: Path, files: tuple[str, ...]) -> dict:
    """One mutant applied in the copy, its tests run, the file restored; then the test that failed run again on the
    restored code, where it must pass: a test that fails without the mutant (a file the copy lacks, a broken test)
    kills nothing (`fails_unmutated`)."""
    path = where / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.old, mutant.new))
    try:
        failed, summary, seconds = run_tests(where, files)
    finally:
        path.write_text(original)
    if failed:
        again, rerun, _ = run_tests(where, (failed[0],))
        broken = bool(again) or not re.search(r"\d+ passed", rerun)  # it must run, and pass
    else:
        broken = False
    line = original[:original.index(mutant.old)].count("\n") + 1
    row = {"id": mutant.id, "where": f"{mutant.path.removeprefix('src/spectool/')}:{line}", "what": mutant.what,
           "killed_by": failed[0] if failed and not broken else None, "seconds": round(seconds, 1), "pytest": summary}
    return {**row, "fails_unmutated": failed[0]} if broken else row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help="mutant ids (default: all)")
    ap.add_argument("--all-unit", action="store_true", help="run every unit test of tests/, not the targeted files")
    ap.add_argument("--tests", nargs="+", metavar="TEST", help="run these test files or ids instead of each mutant's own")
    ap.add_argument("--out", type=Path, help="write the rows and the score as JSON here")
    args = ap.parse_args(argv)
    unknown = set(args.ids) - {m.id for m in ALL}
    if unknown:
        ap.error(f"unknown mutant ids {sorted(unknown)}; known: {' '.join(m.id for m in ALL)}")
    chosen = tuple(m for m in ALL if not args.ids or m.id in args.ids)
    if problems := stale(chosen, ROOT):
        print("mutants that no longer apply (rewrite them for the code as it is now):\n  " + "\n  ".join(problems))
        return 2
    code = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    where = scratch_copy()  # the code as it is now: what `code` names
    rows = []
    try:
        for m in chosen:
            row = run(m, where, ("tests",) if args.all_unit else tuple(args.tests) if args.tests else m.tests)
            rows.append(row)
            verdict = (f"killed by {row['killed_by']}" if row["killed_by"] else
                       f"NOT SCORED: {row['fails_unmutated']} fails without the mutant" if "fails_unmutated" in row
                       else "SURVIVED")
            print(f"{row['id']:3} {row['where']:34} {row['what'][:52]:52} {verdict} ({row['seconds']:.0f} s)", flush=True)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    killed = sum(r["killed_by"] is not None for r in rows)
    sets = {name: f"{sum(r['killed_by'] is not None for r in rows if r['id'] in ids)}/"
                  f"{sum(r['id'] in ids for r in rows)}"
            for name, ids in (("audit", {m.id for m in MUTANTS}), ("2026-11-28", {m.id for m in NEW_MUTANTS}))}
    print(f"mutation score: {killed}/{len(rows)} killed ({', '.join(f'{k} {v}' for k, v in sets.items())})")
    unscored = [r["id"] for r in rows if "fails_unmutated" in r]
    if unscored:
        print(f"not scored: {' '.join(unscored)} (a test that fails on the unmutated code: fix it, then run again)")
    if args.out:
        args.out.write_text(json.dumps({"score": f"{killed}/{len(rows)}", "sets": sets, "all_unit": args.all_unit,
                                        "code": code.stdout.strip(), "command": "benchmarks/mutation.py " + " ".join(
                                            sys.argv[1:] if argv is None else argv), "rows": rows}, indent=1) + "\n")
    return 2 if unscored else 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
