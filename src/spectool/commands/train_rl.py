"""`spectool train-rl`: online GRPO whose rollouts are speculative and whose draft keeps up.

Workflow per step n (sync mode):
  generate  P prompts x G samples on the running vLLM engine (policy + EAGLE-3 draft), scored
  update    one GRPO step on the policy (transformers, accelerate); its forward also yields the
            draft's features (detached) when the draft is refreshed online
  sync      the new policy weights go into the running engine; prefix cache dropped
  check     every `logprob_check_every` steps: engine logprobs == trainer logprobs, or stop
  refresh   every `draft_refresh.every` steps (online), or when it pays (auto): the draft trains on the cached features,
            then goes into the running engine
  eval      every `eval_every` steps: greedy reward on held-out prompts
  log       metrics.jsonl line; checkpoint every `checkpoint_every` steps
Async mode: the rollouts of step n+1 are generated (thread) while step n trains, by the policy of
step n (lag 1); the objective's ratio uses the engine's behaviour logprobs, so the lag is corrected.
A run directory resumes from its last checkpoint: the prompts and seeds of step n are functions of
n, so no step is lost or repeated (metrics past the checkpoint are dropped and redone).
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from spectool.context import RL_YAML, finish_counts, resolve_max_model_len
from spectool.data import load_source
from spectool.draft.checkpoint import draft_metadata, refresh_memory
from spectool.draft.refresh import DraftNotLive, DraftRefresher
from spectool.draft.refresh_policy import RefreshPolicy
from spectool.engine import compat
from spectool.engine.batch import Device, engine_batch
from spectool.engine.compat import drafter_logits_bytes
from spectool.engine.engine import Engine, EngineConfig, Sampling
from spectool.errors import SpectoolError
from spectool.memory import check_train_rl, draft_params, drafter_logits, output_bin_counts, train_rl_plan
from spectool.models import resolve_model
from spectool.precision import engine_dtype, logprob_tolerance, trainer_dtype
from spectool.prompts import check_conversations, encode_tasks
from spectool.rl.config import RESUMABLE_KEYS_IGNORED, RLConfig
from spectool.rl.grpo import group_advantages
from spectool.rl.policy import PolicyTrainer, Rollout, check_engine_logprobs, update_within_memory
from spectool.rl.report import LiveView, plot_run
from spectool.rl.speculation import resolve
from spectool.rl.tasks import StepPrompts
from spectool.runs import MANIFEST, append_jsonl, atomic_dir, atomic_write_json, claim, make_manifest, truncate_jsonl
from spectool.settings.engine import engine_kwargs
from spectool.stats import AcceptanceStats
from spectool.trackers import open_trackers

CHECKPOINTS = "checkpoints"


@dataclass
class Batch:
    step: int
    rollouts: list[Rollout]
    acceptance: AcceptanceStats
    gen_s: float
    gen_tokens: int
    mean_reward: float
    finish_reasons: dict[str, int] = field(default_factory=dict)  # context.finish_counts of the step's rollouts


@dataclass
class RLResult:
    out: str
    steps: int
    resumed_from: int
    seconds: float
    metrics: list[dict] = field(default_factory=list)


@dataclass
class _Run:
    """Everything one train-rl run holds, built by `_setup`."""

    cfg: RLConfig
    out: Path
    model: Any  # ModelRef
    source: Any  # TaskSource
    tokenizer: Any
    tasks: StepPrompts
    eval_tasks: list
    draft: str | None  # the draft folder speculation started from (None: plain decoding)
    start: int  # steps done by the checkpoint resumed from
    trainer: PolicyTrainer
    refresher: Any  # DraftRefresher, or None when the draft is frozen
    cadence: Any  # RefreshPolicy: when the refresher refreshes; a frozen draft's decay watch (None: no draft)
    engine: Any
    tolerance: float  # the engine logprob check's
    history: list[dict]


def check_memory(cfg: RLConfig, model_path: str, spec, longest_prompt: int, total_bytes: int,
                 device_name: str = "") -> None:
    """Print the one-GPU memory plan and refuse one that cannot fit (memory.py), at the batch the engine will hold
    on this GPU (`device_name`, `total_bytes`: engine/batch.py)."""
    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    config, mtp = AutoConfig.from_pretrained(model_path), spec.method == "mtp"
    online = spec.draft_path is not None and cfg.draft_refresh.mode != "frozen"
    dtype = engine_dtype(cfg.engine.dtype)
    drafting = bool(spec.k and (spec.draft_path is not None or mtp))
    batch = engine_batch(rollout_batch(cfg), method=spec.method, k=spec.k if drafting else 0, cpu=False,
                         build=compat.installed(), device=Device(device_name, total_bytes))
    logits = 0
    if drafting:
        logits = drafter_logits(batch.max_num_seqs, spec.k, config.vocab_size,
                                drafter_logits_bytes(spec.method, spec.proposals, dtype))
    bins = output_bin_counts(batch.max_num_seqs, config.vocab_size)
    plan = train_rl_plan(config, engine_share=cfg.engine.gpu_memory_utilization, total_bytes=total_bytes,
                         micro_tokens=cfg.policy.micro_batch_size * (longest_prompt + cfg.rollout.max_tokens),
                         kl_beta=cfg.policy.kl_beta, autocast_bf16=trainer_dtype(dtype) == "bfloat16",
                         draft_params=draft_params(spec.draft_path, mtp) if online else 0, draft_embedding=not mtp,
                         logits=logits, bins=bins,
                         refresh=refresh_memory(config, None if mtp else spec.draft_path, model_path, cfg.draft_refresh,
                                                longest_prompt + cfg.rollout.max_tokens) if online else None)
    plan.notes.append(batch.note(rollout_batch(cfg)))
    check_train_rl(plan, config, cfg.engine.gpu_memory_utilization, logits + bins, dtype)
    print(plan.text())


def rollout_batch(cfg: RLConfig) -> int:
    """The most sequences the engine decodes at once: a step's rollouts, or an evaluation's."""
    r = cfg.rollout
    return max(r.prompts_per_step * r.group_size, r.eval_prompts * r.eval_samples if r.eval_every else 0)


def _refresher(cfg: RLConfig, draft_path: str, trainer: PolicyTrainer):
    """The public DraftRefresher on the trainer's policy, as any outside trainer builds it (the
    policy's own MTP layers: `draft_path` is a model folder holding them)."""

    if cfg.speculation.method == "mtp":
        return DraftRefresher.from_mtp(draft_path, trainer.model, cfg.draft_refresh, seed=cfg.seed)
    return DraftRefresher.from_folder(draft_path, trainer.model, cfg.draft_refresh, seed=cfg.seed)


def _setup(cfg: RLConfig) -> _Run:
    """Data, speculation, the checkpoint to resume from, the trainer (and online draft), the engine."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

    out, model = Path(cfg.out), resolve_model(cfg.model)
    source = load_source(cfg.data, seed=cfg.seed, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col)
    if not source.verifiable:
        raise SpectoolError(f"data {cfg.data} has no verifier: GRPO needs rewards (use gym:..., or a file or "
                            "hub source with answers: answer_col names their column)")
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    tasks = StepPrompts(source, tokenizer, cfg)
    eval_tasks = source.tasks("eval", cfg.rollout.eval_prompts) if cfg.rollout.eval_every else []
    check_conversations(eval_tasks, cfg.rollout)
    spec = resolve(cfg, model)
    schedule, draft_path, k = spec.schedule, spec.draft_path, spec.k
    longest = max(map(len, tasks.ids + encode_tasks(tokenizer, eval_tasks, cfg.rollout)))
    drafting = bool(k and (draft_path is not None or spec.method == "mtp"))
    context = resolve_max_model_len(model.path, longest, cfg.rollout.max_tokens, extra=k if drafting else 0,
                                    user=cfg.engine.max_model_len or None, names=RL_YAML,
                                    draft_path=draft_path if drafting and spec.method != "mtp" else None,
                                    method=spec.method if drafting else "")
    if torch.cuda.is_available():  # before the folder is claimed and the trainer or the engine takes any memory
        gpu = torch.cuda.get_device_properties(0)
        check_memory(cfg, model.path, spec, max(map(len, tasks.ids)), gpu.total_memory, gpu.name)
    claim(out, "train-rl", cfg.as_dict(), may_change=RESUMABLE_KEYS_IGNORED, flag="out")
    ckpt = _latest_checkpoint(out)
    p, e = cfg.policy, cfg.engine
    dtype = engine_dtype(e.dtype)
    trainer = PolicyTrainer(str(ckpt[1] / "policy") if ckpt else model.path, p.lr, cfg.rollout.temperature,
                            p.eps_low, p.eps_high, p.kl_beta, p.micro_batch_size, p.max_grad_norm, seed=cfg.seed,
                            engine_dtype=dtype)
    refresher, cadence = None, None
    if draft_path is not None:
        cadence = RefreshPolicy.of(cfg.draft_refresh)  # a frozen draft's too: its decay watch
        if cfg.draft_refresh.refreshes:  # from the refreshed draft as it was at the checkpoint, if any
            refresher = _refresher(cfg, _checkpoint_draft(ckpt, spec.method) or draft_path, trainer)
    if ckpt:
        st = torch.load(ckpt[1] / "state.pt", weights_only=False)
        trainer.load_state_dict(st["policy"])
        if refresher is not None:
            refresher.load_state_dict(st["draft"])
        if cadence is not None:
            cadence = RefreshPolicy.restore(st.get("refresh_policy"), cfg.draft_refresh)  # the rule as configured now
    mtp = spec.method == "mtp"
    engine = Engine(EngineConfig(
        model_path=model.path, draft_path=None if mtp else draft_path, method=spec.method, k=max(k, 1),
        k_schedule=schedule, seed=cfg.seed, max_num_seqs=rollout_batch(cfg),
        log_path=str(out / "engine.log"), draft_sampling=spec.proposals, **{**engine_kwargs(e), "dtype": dtype},
        kv_cache_gib=e.kv_cache_gib, max_model_len=context,
        logprobs_mode="processed_logprobs",  # behaviour logprobs at the sampling temperature
    ))
    if ckpt:
        engine.update_policy(trainer.engine_state())  # the engine starts from the base model's weights
        if refresher is not None:  # and from the run's own draft (MTP: the base model's layers)
            _push_draft(refresher, engine, ckpt[0])
    start = ckpt[0] if ckpt else 0
    return _Run(cfg, out, model, source, tokenizer, tasks, eval_tasks, spec.draft_path, start, trainer, refresher, cadence,
                engine, logprob_tolerance(p.logprob_tolerance or None, dtype), truncate_jsonl(out / "metrics.jsonl", start))


def _train_step(r: _Run, step: int, batch: Batch, rec: dict[str, Any], wait_for_next) -> float | None:
    """After generation: update, (async: wait for the next batch), sync, check, refresh, eval,
    checkpoint; fills `rec`. Returns the seconds waited for the next batch (async), else None."""
    cfg, p, dr, engine, trainer, refresher = r.cfg, r.cfg.policy, r.cfg.draft_refresh, r.engine, r.trainer, r.refresher
    last = step + 1 == p.steps
    t = time.perf_counter()
    rep = update_within_memory(trainer, batch.rollouts, refresher.capture if refresher else None,
                               cfg.engine.gpu_memory_utilization)
    rec.update(update_s=time.perf_counter() - t, loss=rep.loss, clip_fraction=rep.clip_fraction, kl=rep.kl,
               grad_norm=rep.grad_norm, behaviour_gap=rep.behaviour_gap, train_tokens=rep.tokens)
    if refresher is not None:  # a drafter that died after the last push stops the run
        _check_alive(refresher, batch, step + 1)
        t = time.perf_counter()
        rec.update(draft_agreement=refresher.fresh_agreement(), capture_s=refresher.capture_s)
        rec["agreement_s"], refresher.capture_s = time.perf_counter() - t, 0.0
        if refresher.gain:  # after a refresh: the new and the previous draft on the same rollouts, per prompt
            rec["draft_gain"] = refresher.gain
    if r.cadence is not None:  # the agreement's seconds go into the refresh's ledger: auto pays them for its rule
        rec["staleness"] = r.cadence.observe(rec.get("acceptance_length"), batch.gen_s, rec.get("agreement_s", 0.0),
                                             rec.get("draft_gain"))
        warning = r.cadence.decayed()
        if warning:
            rec["warning"] = warning
    waited = wait_for_next()  # the engine must be idle before its weights change
    t = time.perf_counter()
    engine.update_policy(trainer.engine_state())
    rec["sync_s"] = time.perf_counter() - t
    if (step + 1) % p.logprob_check_every == 0 or last:
        t = time.perf_counter()
        rec.update(check_engine_logprobs(engine, trainer, batch.rollouts, r.tolerance, step + 1))
        rec["check_s"] = time.perf_counter() - t
    if refresher is not None and r.cadence.due(step + 1):
        t = time.perf_counter()
        ref = refresher.refresh(dr.steps_per_refresh)
        pushed = _push_draft(refresher, engine, step + 1)
        spent = time.perf_counter() - t
        rec.update(refresh_s=spent, refresh_reason=r.cadence.reason, draft_loss=ref.loss, draft_top1_before=ref.top1_before,
                   draft_top1_after=ref.top1_after, draft_steps=ref.steps, draft_check_excess=pushed.max_excess,
                   draft_check_power=pushed.has_power, refresh_train_s=ref.train_s, refresh_measure_s=ref.measure_s,
                   push_s=pushed.send_s, probe_s=pushed.probe_s)
        r.cadence.refreshed(spent)
    if r.cadence is not None and r.cadence.ledger:  # auto: the books it decided on
        rec["refresh_ledger"] = r.cadence.ledger
    if cfg.rollout.eval_every and ((step + 1) % cfg.rollout.eval_every == 0 or last):
        t = time.perf_counter()
        rec["eval_reward"] = _eval_reward(engine, r.tokenizer, r.source, r.eval_tasks, cfg)
        rec["eval_s"] = time.perf_counter() - t
    if (step + 1) % cfg.checkpoint_every == 0 or last:
        _save_checkpoint(r.out, step + 1, trainer, refresher, r.model, r.tokenizer, cfg, r.cadence)
        rec["checkpoint"] = True
    return waited


def _loop(r: _Run, on_step) -> None:
    """Steps start..steps: generate (async: the next step's batch in a thread), train, log."""

    cfg, steps = r.cfg, r.cfg.policy.steps
    pool = ThreadPoolExecutor(max_workers=1) if cfg.rollout.mode == "async" else None
    initial_eval = None
    if r.start == 0 and cfg.rollout.eval_every:  # the baseline a rising held-out reward is read against
        initial_eval = _eval_reward(r.engine, r.tokenizer, r.source, r.eval_tasks, cfg)
    carried: Batch | None = None  # async: the next step's batch, generated during this step
    try:
        with LiveView(cfg, r.start, r.history) as view, \
                open_trackers(cfg.report_to, "report_to", r.out, cfg.as_dict(), r.start) as trackers:
            for step in range(r.start, steps):
                t0 = time.perf_counter()
                batch = carried or generate_step(r.engine, r.source, r.tasks, step, cfg)
                nxt = pool.submit(generate_step, r.engine, r.source, r.tasks, step + 1, cfg) \
                    if pool is not None and step + 1 < steps else None
                rec: dict[str, Any] = {"step": step + 1, "mode": cfg.rollout.mode, **batch_metrics(batch)}
                if initial_eval is not None and step == 0:
                    rec["eval_reward_initial"] = initial_eval

                def wait_for_next() -> float | None:
                    nonlocal carried
                    if nxt is None:
                        carried = None
                        return 0.0 if pool is not None else None
                    tw = time.perf_counter()
                    carried = nxt.result()
                    return time.perf_counter() - tw

                wait_s = _train_step(r, step, batch, rec, wait_for_next)
                rec["step_s"] = time.perf_counter() - t0
                if wait_s is not None:
                    rec["gen_wait_s"] = wait_s
                # share of the step spent generating (async: the part the trainer waited for it)
                rec["gen_share"] = (rec["gen_s"] if wait_s is None else wait_s) / rec["step_s"]
                append_jsonl(r.out / "metrics.jsonl", rec)
                trackers.log(rec["step"], rec)  # report_to: the same line, at its step
                r.history.append(rec)
                view.update(rec)
                if on_step:
                    on_step(rec)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)


def run(cfg: RLConfig, on_step: Callable[[dict], None] | None = None) -> RLResult:
    cfg.validate()
    t_start = time.perf_counter()
    r = _setup(cfg)
    _loop(r, on_step)
    plots = plot_run(r.history, r.out)
    spec = cfg.speculation
    atomic_write_json(r.out / MANIFEST, make_manifest(
        "train-rl", model=r.model.name, model_identity=r.model.identity, data=cfg.data, steps=cfg.policy.steps,
        resumed_from=r.start, sampler_fix=r.engine.sampler_fix, served_by=r.engine.served_by, draft=r.draft,
        draft_mode=cfg.draft_refresh.mode if r.draft else "no speculation", k=spec.k,
        plots=plots, summary=run_summary(r.history)))
    return RLResult(str(r.out), cfg.policy.steps, r.start, time.perf_counter() - t_start, r.history)


def generate_step(engine, source, tasks: StepPrompts, step: int, cfg: RLConfig) -> Batch:
    r = cfg.rollout
    idx = tasks.for_step(step)
    t0 = time.perf_counter()
    outs, acc = engine.generate([tasks.ids[i] for i in idx],
                                Sampling(n=r.group_size, max_tokens=r.max_tokens, temperature=r.temperature,
                                         seed=cfg.seed * 1_000_003 + step * 10_007))
    gen_s = time.perf_counter() - t0
    rewards = torch.tensor([[source.score(tasks.tasks[i], c.text) for c in samples] for i, samples in zip(idx, outs)])
    adv = group_advantages(rewards, scale_by_std=cfg.policy.scale_adv_by_std)  # [P, G]
    rollouts = [Rollout(c.prompt_ids, c.response_ids, c.logprobs, float(rewards[i, j]), float(adv[i, j]))
                for i, samples in enumerate(outs) for j, c in enumerate(samples) if c.response_ids]
    tokens = sum(len(x.response_ids) for x in rollouts)
    return Batch(step, rollouts, acc, gen_s, tokens, float(rewards.mean()),
                 finish_counts(c.finish_reason for samples in outs for c in samples))


def batch_metrics(b: Batch) -> dict[str, Any]:
    m: dict[str, Any] = {"reward": b.mean_reward, "gen_s": b.gen_s, "gen_tokens": b.gen_tokens,
                         "gen_tokens_per_s": b.gen_tokens / b.gen_s if b.gen_s else 0.0,
                         "response_len": b.gen_tokens / max(len(b.rollouts), 1), "entropy": _entropy(b.rollouts),
                         "finish_length": b.finish_reasons.get("length", 0), "finish_stop": b.finish_reasons.get("stop", 0)}
    if b.acceptance.num_drafts:
        m["acceptance_length"] = b.acceptance.mean_acceptance_length
        m["acceptance_per_pos"] = b.acceptance.per_position_rate
        m["spec_counters"] = asdict(b.acceptance)
    return m


def _entropy(rollouts: list[Rollout]) -> float | None:
    """The policy's entropy per sampled token at the rollout temperature, estimated by the mean of -log p of the
    tokens it sampled (an unbiased estimate: E[-log p(x)] over x ~ p is the entropy); None without tokens."""
    lps = [lp for x in rollouts for lp in x.behaviour_logprobs]
    return -sum(lps) / len(lps) if lps else None


def _push_draft(refresher, engine, step: int):
    """The refreshed draft into the running engine, checked there in the engine's dtype."""

    try:
        return refresher.push(engine)
    except DraftNotLive as e:
        raise SpectoolError(f"step {step}: {e} The last checkpoint is intact.") from None


def _check_alive(refresher, batch: Batch, step: int) -> None:
    try:
        refresher.check_acceptance(batch.acceptance)
    except DraftNotLive as e:
        raise SpectoolError(f"step {step}: {e} The last checkpoint is intact.") from None


def _eval_reward(engine, tokenizer, source, eval_tasks, cfg: RLConfig) -> float:
    r = cfg.rollout
    greedy = r.eval_samples == 1
    # sampled: the same seeds at every eval (common random numbers: less noise between evals)
    outs, _ = engine.generate(encode_tasks(tokenizer, eval_tasks, cfg.rollout),
                              Sampling(n=r.eval_samples, max_tokens=r.max_tokens, temperature=0.0 if greedy else r.temperature,
                                       seed=None if greedy else cfg.seed + 99_991))
    scores = [source.score(t, c.text) for t, samples in zip(eval_tasks, outs) for c in samples]
    return sum(scores) / len(scores)


def _save_checkpoint(out: Path, step: int, trainer: PolicyTrainer, refresher, model, tokenizer, cfg: RLConfig,
                     cadence=None) -> None:
    """checkpoints/step-N/{policy (HF folder), draft (vLLM-loadable), state.pt}, written whole
    (runs.atomic_dir), so a crash never leaves a half checkpoint. Older ones are removed."""

    root = out / CHECKPOINTS
    with atomic_dir(root / f"step-{step:06d}") as tmp:
        trainer.unwrapped.save_pretrained(tmp / "policy", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "policy")
        st = {"step": step, "policy": trainer.state_dict()}
        if refresher is not None:
            where = tmp / ("policy" if cfg.speculation.method == "mtp" else "draft")  # MTP layers: a MiMo policy folder
            refresher.save(where, **draft_metadata(model, refresher.online.ttt_steps, rl_step=step))
            st["draft"] = refresher.state_dict()
            st["refresh_policy"] = asdict(cadence) if cadence is not None else None
        torch.save(st, tmp / "state.pt")
    for old in sorted(root.glob("step-*"))[:-1]:
        shutil.rmtree(old, ignore_errors=True)


def _checkpoint_draft(ckpt: tuple[int, Path] | None, method: str) -> str | None:
    """The refreshed draft a checkpoint holds (MTP layers: in its saved policy), for the refresher alone. The engine
    starts from the run's own draft folder and gets this one pushed: vLLM re-reads a DFlash draft's mask_embedding.pt
    from the folder its engine started from at every push, and the next checkpoint deletes this one."""
    return str(ckpt[1] / ("policy" if method == "mtp" else "draft")) if ckpt else None


def _latest_checkpoint(out: Path) -> tuple[int, Path] | None:
    found = sorted((out / CHECKPOINTS).glob("step-*")) if (out / CHECKPOINTS).exists() else []
    found = [f for f in found if (f / "state.pt").exists()]
    return (int(found[-1].name.split("-")[1]), found[-1]) if found else None


def run_summary(history: list[dict]) -> dict:
    if not history:
        return {}

    def mean(key):
        vals = [r[key] for r in history if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    evals = [history[0]["eval_reward_initial"]] if "eval_reward_initial" in history[0] else []
    evals += [r["eval_reward"] for r in history if "eval_reward" in r]
    return {"mean_reward": mean("reward"), "mean_acceptance_length": mean("acceptance_length"),
            "mean_step_s": mean("step_s"), "mean_gen_s": mean("gen_s"), "mean_gen_share": mean("gen_share"),
            "gen_tokens_per_s": mean("gen_tokens_per_s"), "first_eval_reward": evals[0] if evals else None,
            "last_eval_reward": evals[-1] if evals else None,
            "refreshes": sum("refresh_s" in r for r in history),
            "finish_length": sum(r.get("finish_length", 0) for r in history),  # rollouts cut at rollout.max_tokens
            "finish_stop": sum(r.get("finish_stop", 0) for r in history),  # rollouts ended at EOS
            "refresh_s_total": sum(r.get("refresh_s", 0.0) for r in history)}
