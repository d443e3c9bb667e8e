"""`spectool rollout`: (speculative) rollouts with vLLM, scored by the data source's verifier.

Workflow: resolve model and data -> start the engine -> generate for the prompts -> score ->
records (same schema as harvest) -> summary (mean reward, tokens/s, mean response length,
acceptance from the engine's own counters when a draft is used).

--compare times plain decoding, then speculation, each in passes over the same prompts and seeds, and judges the
speedup from the arms' own variation, never from the point estimate alone (`judge`): "won" or "lost" only where the
speedup's 95% bound from the paired passes (stats.sweep.block_speedups, sweep-k's statistics, a pass for a round)
clears COMPARE_MARGIN, else "no difference beyond the noise"; "not judged" where other processes took more than
machine_load.OTHERS_LIMIT of the CPU while an arm was timed; a "measurement fault" where the speedup's lower bound
passes the acceptance length (a verify step cheaper than a plain one: it runs the policy at least once).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from spectool import machine_load
from spectool.config.rollout import RolloutConfig
from spectool.context import describe_finish, finish_counts, resolve_max_model_len
from spectool.data import load_source
from spectool.draft.guard import check_speculation
from spectool.engine.engine import Engine, EngineConfig
from spectool.engine.proposals import resolve
from spectool.errors import SpectoolError
from spectool.families import FAMILIES
from spectool.generation import rollout_tasks
from spectool.models import draft_model_path, resolve_model
from spectool.prompts import check_conversations, encode_tasks, rendering
from spectool.records import write_shard
from spectool.runs import MANIFEST, atomic_write_json, claim, make_manifest
from spectool.schedule import read_schedule, schedule_method
from spectool.settings.engine import engine_kwargs
from spectool.settings.sampling import SamplingConfig
from spectool.stats import AcceptanceStats
from spectool.stats.sweep import block_speedups
from spectool.ui import console

# --compare times each arm for at least this long (the same prompts and seeds again, records from the
# first pass only): 13 short greedy answers decode in ~2 s here, too little to time a speedup.
MIN_TIMED_S = 8.0
# and in this many passes at least: the spread of the paired passes is the noise the verdict measures (two pairs
# measure it on 1 degree of freedom, a t quantile of 6.3 at 95%; three on 2, 2.9)
MIN_PASSES = 3
# a win or a loss must clear this margin as well as the passes' noise: one engine per arm measures the noise between
# passes, not the noise between engine runs (sweep-k measures that; its --min-gain default is the same 3%)
COMPARE_MARGIN = 0.03
WARM_UP_TOKENS = 64  # per sequence, before each arm is timed (as sweep-k warms up)
ARMS = {"plain": "plain decoding", "speculative": "speculation"}  # RolloutResult.load's keys, in words


@dataclass
class Verdict:
    """--compare's judgement of the speedup (RolloutResult.judge)."""

    word: str  # "won" | "lost" | "no difference beyond the noise" | "not judged" | "measurement fault"
    reason: str  # why, from what was measured: the bounds, the contention, the fault
    lo: float = math.nan  # the speedup's one-sided 95% bounds from the paired passes (nan: no noise measured)
    hi: float = math.nan
    pairs: int = 0  # passes paired between the arms


@dataclass
class RolloutResult:
    n_prompts: int  # the prompts used (the split may hold fewer than asked)
    n_completions: int
    mean_reward: float
    mean_response_len: float
    tokens_per_s: float
    seconds: float
    acceptance: AcceptanceStats
    out: str | None = None
    k: int | str | None = None
    draft_sampling: str = "greedy"  # the proposals that ran (engine/proposals.py)
    draft_sampling_why: str = ""
    plain_tokens_per_s: float | None = None  # --compare: plain decoding, same prompts and settings
    n_prompts_asked: int | None = None
    dtype: str = "float32"  # the precision the engine served
    parallel: bool = False  # a parallel drafter: one draft forward per verify step
    timed_tokens: int = 0  # --compare: tokens each arm's timing rests on (passes over the prompts)
    finish_reasons: dict = field(default_factory=dict)  # the records: "length" (cut at --max-tokens), "stop" (EOS)
    max_model_len: int = 0  # the engine's context (context.resolve_max_model_len)
    # --compare: each arm's timed passes [[tokens, seconds]] (same prompts and seeds; pass i of each arm paired)
    plain_passes: list = field(default_factory=list)
    passes: list = field(default_factory=list)
    load: dict = field(default_factory=dict)  # --compare: per arm (ARMS), machine_load.between over its timed passes
    verdict: Verdict | None = None  # --compare: `judge()`, as run() recorded it

    def judge(self) -> Verdict | None:
        """--compare's verdict from the arms' timed passes, their contention and the acceptance length (the order
        of the checks: a fault first, then contention, then the bounds). None without a plain arm."""
        if not self.speedup:
            return None
        pairs = list(zip(self.plain_passes, self.passes))
        fit = block_speedups([[math.log(t / s) for t, s in pair] for pair in pairs])[0] if pairs else None
        lo, hi = (fit.lo, fit.hi) if fit else (math.nan, math.nan)
        bounds = (f"95% bounds {lo:.2f}x-{hi:.2f}x over {len(pairs)} paired timed passes" if not math.isnan(lo)
                  else f"{len(pairs)} paired timed pass{'es' if len(pairs) != 1 else ''}: no noise measured")
        busy = [f"{text} while {ARMS[arm]} was timed" for arm in ARMS
                if (text := machine_load.busy_text(self.load.get(arm, {})))]
        al = self.acceptance.mean_acceptance_length if self.acceptance.num_drafts else None
        least = self.speedup if math.isnan(lo) else lo
        if al is not None and least > al:  # a verify step runs the policy once at least: it cannot cost less
            return Verdict("measurement fault", f"{self.speedup:.2f}x ({bounds}) at acceptance length {al:.2f} would "
                           f"make a verify step cost {al / self.speedup:.2f} plain decoding steps, less than one: the "
                           "arms were not timed alike ("
                           + ("; ".join(busy) if busy else "other processes took no more than "
                              f"{machine_load.OTHERS_LIMIT:.0%} of the CPU in either arm: something in this run slowed "
                              "plain decoding or sped speculation")
                           + "), not a win; run again where nothing else runs", lo, hi, len(pairs))
        if busy:
            return Verdict("not judged", "; ".join(busy) + f" (more than {machine_load.OTHERS_LIMIT:.0%}): "
                           f"{self.speedup:.2f}x ({bounds}) measures their load as well as speculation; run again where "
                           "nothing else runs",
                           lo, hi, len(pairs))
        margin = f"a {COMPARE_MARGIN:.0%} margin"
        if not math.isnan(lo) and lo >= 1 + COMPARE_MARGIN:
            return Verdict("won", f"{self.speedup:.2f}x, {bounds}, beyond {margin}", lo, hi, len(pairs))
        if not math.isnan(hi) and hi <= 1 / (1 + COMPARE_MARGIN):
            return Verdict("lost", f"{self.speedup:.2f}x, {bounds}, beyond {margin}", lo, hi, len(pairs))
        return Verdict("no difference beyond the noise", f"{self.speedup:.2f}x, {bounds}, within the noise or {margin} "
                       "of 1x", lo, hi, len(pairs))

    def why(self) -> str | None:
        """One line, "speculation <verdict>: ...": the verdict (`judge`) and why speculation won or lost here, from
        what was measured (acceptance length, the cost of a speculative step against a plain one, the sequences
        decoded at once), and where it would pay."""
        verdict = self.verdict or self.judge()
        if verdict is None or not self.acceptance.num_drafts:
            return None
        al, s = self.acceptance.mean_acceptance_length, self.speedup
        step_cost = al / s  # a speculative step's time in plain steps: tokens per step / speedup
        drafts = ("1 draft forward" if self.parallel
                  else f"{self.k} draft forwards" if isinstance(self.k, int) else "the draft forwards")
        verify = f"{self.k + 1} tokens" if isinstance(self.k, int) else "k + 1 tokens"
        what = f"({drafts} + the policy on {verify}, {self.n_completions} sequences at once, {self.dtype})"
        said = f"speculation {verdict.word}" if verdict.word in ("won", "lost") else f"speculation: {verdict.word}"
        if verdict.word == "measurement fault":  # the step cost it implies is the fault, never a reason
            return (f"{said}: {verdict.reason}. A verify step here {what} runs the policy at least once, so it cannot "
                    "cost less than a plain decoding step.")
        head = (f"{said}: {verdict.reason}. Each verify step emitted {al:.2f} tokens per sequence and cost "
                f"{step_cost:.2f} plain decoding steps {what}")
        if verdict.word == "not judged" or s >= 1:
            return head + "."
        return (head + ": more than the tokens it emitted. Speculation pays where a policy step is memory-bound (a GPU, "
                "a large policy, few sequences at once) and acceptance is high; `spectool sweep-k` measures k per batch "
                "size here, `spectool forecast` predicts other batch sizes and acceptance lengths.")

    @property
    def speedup(self) -> float | None:
        return self.tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else None


def run(cfg: RolloutConfig) -> RolloutResult:
    from transformers import AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

    cfg.validate()
    model = resolve_model(cfg.model)
    source = load_source(cfg.data, seed=cfg.sampling.seed, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col)
    tasks = source.tasks(cfg.split, cfg.sampling.n_prompts)
    check_conversations(tasks, cfg)
    if len(tasks) < cfg.sampling.n_prompts:
        print(f"rollout: --n-prompts {cfg.sampling.n_prompts} asked, but the {cfg.split} split of {cfg.data} holds "
              f"{len(tasks)}: using {len(tasks)} (more data, or --split train, gives more)", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(model.path)

    proposals, proposals_why = resolve(cfg.draft_sampling)
    schedule, draft = read_schedule(cfg.sweep, cfg.draft, proposals) if cfg.k == "auto" else (None, cfg.draft)
    method = schedule_method(cfg.sweep) if cfg.k == "auto" else cfg.method  # --k auto: the family the sweep chose
    if cfg.k == "auto" and cfg.method not in ("eagle3", method):  # eagle3: the default, not a choice
        raise SpectoolError(f"--method {cfg.method}: --sweep {cfg.sweep} chose {method} drafts for --k auto; drop "
                            f"--method or pass --method {method}")
    max_k = max(k for _, _, k in schedule) if schedule else cfg.k
    draft_path = None
    if draft or method == "mtp":
        checked = check_speculation(model, method, draft, max_k)
        draft_path = checked.draft
        if checked.note:
            print(f"rollout: {checked.note}", file=sys.stderr)
    if cfg.draft_model:
        draft_path, method = draft_model_path(cfg.draft_model, model), "draft_model"
    drafting = bool(draft_path or method == "mtp")
    # the context (and the draft's position range) for the prompts as the engine gets them, before any engine starts
    context = resolve_max_model_len(model.path, max(map(len, encode_tasks(tokenizer, tasks, cfg))),
                                    cfg.sampling.max_tokens, extra=max(max_k, 1) if drafting else 0,
                                    user=cfg.max_model_len, draft_path=draft_path, method=method)
    batch = len(tasks) * cfg.sampling.samples
    check_memory(cfg, model.path, method if drafting else "", max(max_k, 1) if drafting else 0, proposals, batch)
    if cfg.out:  # after every check of the draft and the memory plan: a refused run writes nothing
        claim(Path(cfg.out), "rollout", cfg, defaults=RolloutConfig())  # a run from before a setting: its default
    log_path = str(Path(cfg.out) / "engine.log") if cfg.out else None
    plain_tps, plain_passes, load = None, [], {}
    if cfg.compare:
        plain = Engine(EngineConfig(model_path=model.path, seed=cfg.sampling.seed, log_path=log_path,
                                    **engine_kwargs(cfg), max_model_len=context))
        _warm_up(plain, tokenizer, source, tasks, cfg)
        before = machine_load.snapshot()  # what other processes take of the CPU while this arm is timed
        _, _, n_plain, s_plain = rollout_tasks(plain, tokenizer, source, tasks, cfg.sampling, cfg)
        plain_passes = timed_passes(plain, tokenizer, source, tasks, cfg, [n_plain, s_plain], MIN_PASSES)
        load["plain"] = machine_load.between(before, machine_load.snapshot())
        plain_tps = sum(t for t, _ in plain_passes) / sum(s for _, s in plain_passes)
        plain.close()  # the speculative arm starts on a free device
    engine = Engine(EngineConfig(model_path=model.path, seed=cfg.sampling.seed, draft_path=draft_path, log_path=log_path,
                                 method=method, k=max(max_k, 1), k_schedule=schedule, draft_sampling=proposals,
                                 **engine_kwargs(cfg), max_num_seqs=batch, max_model_len=context,
                                 synthetic_acceptance={"length": cfg.acceptance_length} if cfg.acceptance_length else None))
    _warm_up(engine, tokenizer, source, tasks, cfg)
    before = machine_load.snapshot()
    rows, stats, n_tokens, seconds = rollout_tasks(engine, tokenizer, source, tasks, cfg.sampling, cfg,
                                                   progress=_progress("rollout"))
    # every plain pass gets its pair: pass i of each arm decodes the same prompts with the same seeds
    passes = (timed_passes(engine, tokenizer, source, tasks, cfg, [n_tokens, seconds],
                            max(MIN_PASSES, len(plain_passes))) if cfg.compare else [[n_tokens, seconds]])
    if cfg.compare:
        load["speculative"] = machine_load.between(before, machine_load.snapshot())
    timed_tokens, timed_s = sum(t for t, _ in passes), sum(s for _, s in passes)
    result = RolloutResult(
        n_prompts=len(tasks), n_completions=len(rows),
        mean_reward=sum(r["reward"] for r in rows) / len(rows),
        mean_response_len=n_tokens / len(rows), tokens_per_s=timed_tokens / timed_s, seconds=timed_s,
        acceptance=stats, out=cfg.out, k=cfg.k if draft_path or method == "mtp" else None, draft_sampling=proposals,
        draft_sampling_why=proposals_why,
        plain_tokens_per_s=plain_tps, n_prompts_asked=cfg.sampling.n_prompts, dtype=engine.dtype,
        parallel=method in FAMILIES and FAMILIES[method].parallel, timed_tokens=timed_tokens if cfg.compare else 0,
        finish_reasons=finish_counts(r["finish_reason"] for r in rows), max_model_len=context,
        plain_passes=plain_passes, passes=passes if cfg.compare else [], load=load,
    )
    result.verdict = result.judge()
    if cfg.out:
        out = Path(cfg.out)
        write_shard(out, 0, rows)
        atomic_write_json(
            out / MANIFEST,
            make_manifest("rollout", model=model.name, model_identity=model.identity, data=cfg.data,
                          split=cfg.split, rendering=rendering(cfg), sampling=cfg.sampling, records=len(rows),
                          sampler_fix=engine.sampler_fix, served_by=engine.served_by, summary=result),
        )
    return result


def check_memory(cfg: RolloutConfig, model_path: str, method: str, k: int, proposals: str, batch: int) -> None:
    """On a GPU: print the engine's memory plan (memory.rollout_plan) at the batch it will hold there (engine/batch.py)
    and refuse one whose share cannot hold the policy, its preallocated buffers and a little KV cache. `method` ""
    and `k` 0: plain decoding (--compare's plain arm holds the same, less the drafter logits)."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)
    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    from spectool.engine import compat  # noqa: PLC0415 (reads package metadata only)
    from spectool.engine.batch import engine_batch, this_device  # noqa: PLC0415 (heavy: torch)
    from spectool.memory import check_engine_floor, drafter_logits, output_bin_counts, rollout_plan  # noqa: PLC0415
    from spectool.precision import engine_dtype  # noqa: PLC0415 (heavy: torch)

    if not torch.cuda.is_available():
        return
    config, dtype, device = AutoConfig.from_pretrained(model_path), engine_dtype(cfg.dtype), this_device()
    held = engine_batch(batch, method=method, k=k, cpu=False, build=compat.installed(), device=device)
    logits = drafter_logits(held.max_num_seqs, k, config.vocab_size,
                            compat.drafter_logits_bytes(method, proposals, dtype)) if k else 0
    bins = output_bin_counts(held.max_num_seqs, config.vocab_size)
    plan = rollout_plan(config, engine_share=cfg.gpu_memory_utilization, total_bytes=device.total_bytes,
                        logits=logits, bins=bins, dtype=dtype)
    plan.notes.append(held.note(batch))
    check_engine_floor(plan, config, cfg.gpu_memory_utilization, logits + bins, dtype, "--gpu-memory-utilization",
                       "the engine's share", ", or lower --n-prompts x --samples (the buffers' rows)")
    print(plan.text())


PROGRESS_EVERY_S = 10.0  # a long generate call says how far it got this often (a short one says nothing)


def _progress(what: str):
    """Engine.generate's progress callback: a line on stderr every PROGRESS_EVERY_S seconds while a generate call runs
    (a long completion otherwise shows nothing until it ends)."""
    t0 = last = time.perf_counter()

    def report(tokens: int) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last >= PROGRESS_EVERY_S:
            last = now
            print(f"{what}: {tokens} tokens generated in {now - t0:.0f} s ({tokens / (now - t0):.0f} tokens/s)",
                  file=sys.stderr, flush=True)

    return report


def _warm_up(engine, tokenizer, source, tasks, cfg: RolloutConfig) -> None:
    """With --compare, every prompt at the run's sampling, up to WARM_UP_TOKENS each: the engine compiles the step
    shapes of this batch (speculation's vary with the tokens accepted) before anything is timed. Two prompts of 16
    tokens did not: the first timed pass of a k=3 engine at 13 sequences then paid for compiling. Without it,
    nothing is compared, and two short greedy prompts (within the run's max tokens: the context is sized for them)
    start the engine's compilation."""
    s = cfg.sampling
    if not cfg.compare:
        rollout_tasks(engine, tokenizer, source, tasks[:2], SamplingConfig(2, 1, min(s.max_tokens, 16), 0.0, 1.0, 0), cfg)
        return
    rollout_tasks(engine, tokenizer, source, tasks,
                  SamplingConfig(len(tasks), s.samples, min(s.max_tokens, WARM_UP_TOKENS), s.temperature, s.top_p, s.seed),
                  cfg)


def timed_passes(engine, tokenizer, source, tasks, cfg: RolloutConfig, first: list, at_least: int) -> list[list]:
    """[[tokens, seconds]] per timed pass over the same prompts and seeds, `first` (the records' pass) and more,
    until MIN_TIMED_S in all and `at_least` passes."""
    passes = [first]
    while sum(s for _, s in passes) < MIN_TIMED_S or len(passes) < at_least:
        _, _, n, s = rollout_tasks(engine, tokenizer, source, tasks, cfg.sampling, cfg)
        passes.append([n, s])
    return passes


def render(r: RolloutResult) -> None:
    from rich.table import Table  # noqa: PLC0415 (heavy, loaded only on this path)

    t = Table(title="rollout", show_header=False)
    short = f" (of {r.n_prompts_asked} asked: the split holds no more)" if (r.n_prompts_asked or 0) > r.n_prompts else ""
    t.add_row("prompts x completions", f"{r.n_prompts} x {r.n_completions // max(r.n_prompts, 1)}{short}")
    t.add_row("mean reward", f"{r.mean_reward:.3f}")
    t.add_row("mean response length", f"{r.mean_response_len:.1f} tokens")
    if r.finish_reasons:
        t.add_row("completions ended", describe_finish(r.finish_reasons))
    timed = f", {r.timed_tokens} tokens timed" if r.timed_tokens else ""
    t.add_row("throughput", f"{r.tokens_per_s:.1f} tokens/s ({r.seconds:.1f} s{timed})")
    t.add_row("engine precision", r.dtype)
    verdict = r.verdict or r.judge()
    if r.speedup and verdict:
        t.add_row("plain decoding (same prompts)", f"{r.plain_tokens_per_s:.1f} tokens/s")
        bounds = (f" (95% bounds {verdict.lo:.2f}x-{verdict.hi:.2f}x, {verdict.pairs} paired passes)"
                  if not math.isnan(verdict.lo) else "")
        t.add_row("speedup", f"{r.speedup:.2f}x{bounds}: {verdict.word}")
        others = [f"{w['others'] + (w.get('steal') or 0):.0%} ({arm})" for arm, w in r.load.items()
                  if w.get("others") is not None]
        if others:
            t.add_row("CPU others took while timed", ", ".join(others))
    if r.acceptance.num_drafts:
        t.add_row(f"mean acceptance length (k={r.k})", f"{r.acceptance.mean_acceptance_length:.2f}")
        t.add_row("draft proposals", f"{r.draft_sampling} ({r.draft_sampling_why})" if r.draft_sampling_why else r.draft_sampling)
        t.add_row("per-position acceptance", " ".join(f"{x:.2f}" for x in r.acceptance.per_position_rate))
    if r.out:
        t.add_row("records", r.out)
    c = console()
    c.print(t)
    if r.why():  # a fault or a busy machine: flagged as sweep-k flags its load
        warn = "[bold yellow]warning:[/] " if verdict.word in ("measurement fault", "not judged") else ""
        c.print(warn + r.why(), soft_wrap=True, highlight=False)
