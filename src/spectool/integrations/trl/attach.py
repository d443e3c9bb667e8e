"""spectool attached to a built GRPOTrainer: the colocated engine built with spectool's additions, the policy
sync and its logprob check, the refresher and its cadence, the counters into TRL's metrics."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from spectool import ranks
from spectool.constants import OWN_MTP as MTP
from spectool.context import model_limit, read_config
from spectool.draft.refresh import CHECKPOINT_STATE, DraftRefresher
from spectool.draft.refresh_policy import RefreshPolicy
from spectool.engine import colocated
from spectool.engine.compat import spectool_sync, support
from spectool.engine.engine import (
    EngineConfig,
    check_exact_verification,
    prepare_environment,
    spectool_kwargs,
)
from spectool.engine.kernel_cache import remove_truncated_kernels
from spectool.engine.probe import torch_dtype
from spectool.engine.proposals import describe
from spectool.errors import SpectoolError
from spectool.integrations.trl import internals
from spectool.integrations.trl.data import prompt_rendering
from spectool.integrations.trl.settings import SpeculationSettings
from spectool.policy_weights import checkpoint_layout
from spectool.precision import logprob_gaps, logprob_tolerance
from spectool.settings.engine import engine_kwargs
from spectool.stats import AcceptanceStats

log = logging.getLogger(__name__)
DRAFT_IN_CHECKPOINT = "spectool-draft"  # inside each of TRL's checkpoint-N folders
CHECK_ROWS = 2  # sequences of the last training batch whose logprobs are checked after each sync


@contextlib.contextmanager
def speculative_llm(spec: SpeculationSettings):
    """While the trainer is built: TRL's `LLM` name points at a wrapper adding spectool's kwargs."""

    vg = internals.llm_module()
    real = vg.LLM

    def speculative_llm(*args: Any, **kwargs: Any):
        mtp = spec.draft == MTP
        # The context stays TRL's: vllm_max_model_length as given, or unset for vLLM to derive from the model, as TRL
        # leaves it (preflight.check_lengths checked TRL's lengths against it). The CPU build runs prompts whole (no
        # chunked prefill: spectool_kwargs), where vLLM needs a step budget of at least the context: TRL's fixed
        # 4,096 tokens are raised to it (the scheduling changes, the samples do not).
        if kwargs.get("max_num_batched_tokens") and support().cpu_build:
            context = kwargs.get("max_model_len") or model_limit(read_config(kwargs.get("model", "")))[0]
            kwargs["max_num_batched_tokens"] = max(kwargs["max_num_batched_tokens"], context)
        budget = {"max_num_batched_tokens": kwargs["max_num_batched_tokens"]} if kwargs.get("max_num_batched_tokens") else {}
        ecfg = EngineConfig(model_path=kwargs.get("model", ""), draft_path=None if mtp else spec.draft and str(spec.draft),
                            method=spec.method, k=spec.k,
                            k_schedule=spec.k_schedule, draft_sampling=spec.draft_sampling, **engine_kwargs(spec),
                            max_num_seqs=kwargs.get("max_num_seqs"),
                            extra=budget)  # TRL's batch and token budget, kept under vLLM's own (engine/batch.py)
        remove_truncated_kernels(kwargs)  # a killed run's zero-byte kernels would fail this start
        cpu = prepare_environment(ecfg)
        kwargs.update(spectool_kwargs(ecfg, cpu))
        check_exact_verification(kwargs.get("speculative_config"), where="TRL's engine:")
        return real(*args, **kwargs)

    vg.LLM = speculative_llm
    try:
        yield
    finally:
        vg.LLM = real


class _Attached:
    """spectool's pieces on a built GRPOTrainer: sync + check, refresher, callback, metrics."""

    def __init__(self, spec: SpeculationSettings, trainer):
        from transformers import TrainerCallback  # noqa: PLC0415 (heavy, loaded only on this path)

        self.spec, self.trainer = spec, trainer
        self.vg = internals.vllm_generation(trainer)
        self.llm = self.vg.llm
        self.dtype = colocated.served_dtype(self.llm)
        self.tolerance = logprob_tolerance(spec.logprob_tolerance, self.dtype)
        fix = self.llm.collective_rpc("spectool_sampler_fix")[0]
        if support().cpu_build and fix != "applied":
            raise SpectoolError(f"the CPU rejection-sampler fix is not active in TRL's engine ({fix}): speculative "
                                "samples would not be the policy's")
        use_spectool = spectool_sync(spec.policy_sync, support().cpu_build, trainer.model.config.to_dict())
        self._trl_sync = self.vg.sync_weights
        self.vg.sync_weights = self._sync_spectool if use_spectool else self._sync_trl
        # both syncs read TRL's walk: it yields the checkpoint layout vLLM loads (MoE experts per expert)
        internals.wrap_named_params(self.vg, lambda pairs: checkpoint_layout(internals.policy_model(self.vg), pairs))
        self.refresher = None
        if spec.refresh.refreshes and spec.draft == MTP:
            self.refresher = DraftRefresher.from_mtp(trainer.model.name_or_path, trainer.model, spec.refresh,
                                                     seed=spec.seed)
        elif spec.refresh.refreshes and spec.draft:
            self.refresher = DraftRefresher.from_folder(spec.draft, trainer.model, spec.refresh, seed=spec.seed)

        if self.refresher is not None:  # every rank loaded the same draft (a collective under accelerate launch)
            self.refresher.check_one_draft(when="at the start")
        self.cadence = RefreshPolicy.of(spec.refresh)
        self.served_by = None  # the vLLM build and model runner serving the draft
        if spec.draft is not None:
            self.served_by = colocated.served_by(self.llm, spec.method)
            log.info("spectool in TRL: %s; %s; draft refresh %s", self.served_by, describe(spec.draft_sampling),
                     spec.refresh.mode)
        # which rendering TRL gives the dataset's prompts (logged; a warning where the draft's harvest used the other)
        self.rendering = prompt_rendering(spec.draft and str(spec.draft), getattr(trainer, "train_dataset", None),
                                          getattr(trainer, "processing_class", None))
        self.gen_s = 0.0  # generation seconds since the last step end (the cadence's cost side)
        self._trl_generate = self.vg.generate
        self.vg.generate = self._timed_generate
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # ids, mask of the last training forward
        trainer.model.register_forward_pre_hook(self._remember_rows, with_kwargs=True)
        self._counters = colocated.acceptance(self.llm)
        self.pending_check = False  # a push waits for the next generation's counters
        self.history: list[dict] = []  # one entry per refresh: step, draft loss, probe check
        attached = self

        class SpectoolCallback(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                attached.on_step_end(state.global_step)

            def on_save(self, args, state, control, **kw):
                if state.is_world_process_zero:  # the draft is one across ranks: the main process writes it
                    attached.save(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}",
                                  state.global_step)

        trainer.add_callback(SpectoolCallback())
        self._trl_train = trainer.train
        trainer.train = self._train
        trainer.spectool = self  # for users and tests: the refresher, the engine, the metrics

    # --- checkpoint and resume ---------------------------------------------------------------------

    def _train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """TRL's train(), with the refreshed draft of the checkpoint it resumes from restored first."""
        ckpt = resume_from_checkpoint
        if ckpt is True:  # TRL's own rule: the newest checkpoint in output_dir (TRL raises if there is none)
            ckpt = get_last_checkpoint(self.trainer.args.output_dir)
        if ckpt:
            self.restore(Path(ckpt))
        return self._trl_train(resume_from_checkpoint, *args, **kwargs)

    def save(self, checkpoint: Path, step: int) -> None:
        """The refreshed draft, its optimizer and this run's refresh history into TRL's checkpoint."""
        if self.refresher is None:  # a frozen draft is the folder the run was given
            return
        self.refresher.checkpoint(checkpoint / DRAFT_IN_CHECKPOINT,
                                  {"cadence": asdict(self.cadence), "history": self.history, "step": step},
                                  rl_step=step)

    def restore(self, checkpoint: Path) -> None:
        """Every rank: the checkpoint's draft into the refresher and the engine (pushed and checked),
        its refresh history and cadence back; refused (on every rank) for another policy."""
        if self.refresher is None:
            return
        folder = checkpoint / DRAFT_IN_CHECKPOINT
        seen = ranks.gather((folder / CHECKPOINT_STATE).exists())  # the main process wrote it: do all ranks read it?
        ranks.raise_on_any(None if all(seen) or not any(seen) else (
            f"{folder} is read by ranks {[r for r, x in enumerate(seen) if x]} only: TRL's output_dir must be on a "
            "file system every rank reads"))
        if not any(seen):
            log.warning("%s holds no spectool draft (it was saved without spectool's refresh): the draft restarts "
                        "from %s, without its refreshes", checkpoint, self.spec.draft)
            return
        saved = ranks.together(lambda: self.refresher.restore(folder))
        self.cadence = RefreshPolicy.restore(saved["cadence"], self.spec.refresh)
        self.history = list(saved["history"])
        self.refresher.push(self.llm)
        self.pending_check = True  # the restored drafter must accept on the next rollouts
        log.info("spectool: the refreshed draft of %s restored (%d refreshes, %d draft steps)", checkpoint,
                 len(self.history), self.refresher.online.steps)

    def _timed_generate(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return self._trl_generate(*args, **kwargs)
        finally:
            self.gen_s += time.perf_counter() - t

    # --- policy sync ----------------------------------------------------------------------------

    def _sync_spectool(self) -> None:
        """TRL's own parameter walk (it gathers FSDP/DeepSpeed shards and merges PEFT adapters),
        copied in the engine's dtype, then spectool's in-place reload (vLLM's reload_weights, the
        CPU lm_head repacked) and the prefix cache dropped."""

        dt = torch_dtype(self.dtype)  # one host copy per tensor, taken while TRL holds it gathered / merged
        state = ((name, p.detach().to("cpu", dt, copy=True)) for name, p in internals.named_params(self.vg))
        # streamed in chunks; colocate: every process has its engine
        colocated.send_weights(self.llm, "spectool_reload_policy", state)
        self.llm.reset_prefix_cache()
        self._check_logprobs()

    def _sync_trl(self) -> None:
        self._trl_sync()
        self._check_logprobs()

    def _remember_rows(self, module, args, kwargs) -> None:
        if torch.is_grad_enabled() and module.training and "input_ids" in kwargs:
            self._rows = (kwargs["input_ids"][:CHECK_ROWS].detach().cpu(),
                          kwargs.get("attention_mask", torch.ones_like(kwargs["input_ids"]))[:CHECK_ROWS].detach().cpu())

    def _check_logprobs(self) -> None:
        """Engine vs trainer logprobs of the last training batch's first rows, right after a sync."""

        if self._rows is None:  # the first sync comes before any training forward
            return
        seqs = [ids[m.bool()].tolist() for ids, m in zip(*self._rows)]
        prompts, resps = [s[:1] for s in seqs], [s[1:] for s in seqs]
        got = colocated.sequence_logprobs(self.llm, prompts, resps)
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)

        want = []
        with torch.no_grad(), self.trainer.accelerator.autocast():
            for s in seqs:
                ids = torch.tensor([s], device=model.device)
                lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
                want.append(lp.gather(-1, ids[0, 1:, None])[:, 0].tolist())
        mean, worst = logprob_gaps(got, want)
        gaps = ranks.stats({"mean": mean, "max": worst})  # every rank's engine against its own trainer
        self._log("logprob_check_mean_diff", gaps["mean"][0])
        self._log("logprob_check_max_diff", gaps["max"][2])
        ranks.raise_on_any(None if mean <= self.tolerance else (
            f"after TRL's weight sync the engine's logprobs differ from the trainer's by {mean:.3g} nats on average "
            f"(max {worst:.3g}; > {self.tolerance} for a {self.dtype} engine): the engine is not running the trained "
            "weights. "
            "TRL's last checkpoint is intact; try policy_sync='spectool' (or 'trl'), or set logprob_tolerance "
            "if the engine runs in lower precision than the trainer"))

    # --- per step ---------------------------------------------------------------------------------

    def on_step_end(self, step: int) -> None:
        """Every rank at once (each call below that reads other ranks is a collective)."""
        now = colocated.acceptance(self.llm)
        delta, self._counters = now - self._counters, now
        pooled = self._log_acceptance(delta)
        if self.refresher is None:
            self._watch_frozen(pooled)
            return
        if self.pending_check:
            self.refresher.check_acceptance(delta)  # every rank's engine; all stop if one drafter is dead
            self.pending_check = False
        agreement_s, gain = self._agreement()
        gen = ranks.stats({"gen_s": self.gen_s, "features": len(self.refresher.online.buffer), "agreement_s": agreement_s})
        # the cadence reads the ranks' pooled numbers, so every rank takes the same decision
        staleness = self.cadence.observe(pooled.mean_acceptance_length if pooled.num_drafts else None, gen["gen_s"][2],
                                         gen["agreement_s"][2], gain)
        self._log("staleness", staleness)
        self.gen_s = 0.0
        if self.cadence.due(step) and gen["features"][1] > 0:
            t = time.perf_counter()
            rep = self.refresher.refresh(self.spec.refresh.steps_per_refresh)
            pushed = self.refresher.push(self.llm)
            r = ranks.stats({"spent": time.perf_counter() - t, "loss": rep.loss, "top1": rep.top1_after[0],
                             "refresh_train_s": rep.train_s, "refresh_measure_s": rep.measure_s,
                             "push_s": pushed.send_s, "probe_s": pushed.probe_s})
            self.cadence.refreshed(r["spent"][2])
            self.pending_check = True
            self._log("draft_loss", r["loss"][0])
            self._log("draft_loss_max", r["loss"][2])
            self._log("draft_top1_pos1", r["top1"][0])
            self._log("draft_top1_pos1_min", r["top1"][1])
            self._log("draft_check_excess", pushed.max_excess)
            self._log("draft_steps", rep.steps)
            self._log("refresh_s", r["spent"][2])
            for key in ("refresh_train_s", "refresh_measure_s", "push_s", "probe_s"):
                self._log(key, r[key][2])  # the refresh by stage, the slowest rank's (every rank logs the same)
            self.history.append({"step": step, "reason": self.cadence.reason, "loss": r["loss"][0],
                                 "check_excess": pushed.max_excess, "has_power": pushed.has_power})

    def _agreement(self) -> tuple[float, list[list[float]]]:
        """auto: the draft's agreement on the newest rollouts, and after a refresh the previous draft's beside it
        (rule 3's measure, every rank's prompts pooled); its seconds. Other modes measure nothing here."""
        if self.spec.refresh.mode != "auto":
            return 0.0, []
        t = time.perf_counter()
        agreement = self.refresher.fresh_agreement()  # every rank: a collective under FSDP2
        spent = time.perf_counter() - t
        if agreement is not None:
            self._log("draft_agreement", agreement)
        return spent, [g for mine in ranks.gather(self.refresher.gain or []) for g in mine]

    def _watch_frozen(self, pooled: AcceptanceStats) -> None:
        """A frozen draft: the warning, once, when its pooled acceptance decays (draft/refresh_policy.py)."""
        if self.spec.draft is None or not pooled.num_drafts:
            return
        self.cadence.observe(pooled.mean_acceptance_length, self.gen_s)
        self.gen_s = 0.0
        warning = self.cadence.decayed("RefreshSettings.mode (SpectoolSpeculation.refresh)")
        if warning:
            log.warning("spectool: %s", warning)

    def _log_acceptance(self, delta: AcceptanceStats) -> AcceptanceStats:
        """The step's acceptance, overall and per position, pooled over the ranks' engines (every
        rank's counters added up), and the lowest rank's (`_min`); returns the pooled counters."""
        k = self.spec.k
        per_pos = (delta.accepted_per_pos + [0] * k)[:k]
        n, proposed, accepted, *at = ranks.total([delta.num_drafts, delta.num_draft_tokens,
                                                  delta.num_accepted_tokens, *per_pos])
        pooled = AcceptanceStats(n, proposed, accepted, at)
        names = ["acceptance_length", *(f"acceptance_pos{i + 1}" for i in range(k))]
        mine = [delta.mean_acceptance_length, *(a / delta.num_drafts for a in per_pos)] if delta.num_drafts \
            else [math.inf] * (k + 1)  # no drafts on this rank: not its minimum
        lowest = ranks.stats(dict(zip(names, mine)))
        if n:
            self._log("acceptance_length", pooled.mean_acceptance_length)
            for i, rate in enumerate(pooled.per_position_rate):
                self._log(f"acceptance_pos{i + 1}", rate)
            for key, (_, low, _) in lowest.items():
                if math.isfinite(low):
                    self._log(f"{key}_min", low)
        return pooled

    def _log(self, key: str, value: float) -> None:
        internals.log_metric(self.trainer, f"spectool/{key}", value)




def attach(spec: SpeculationSettings, trainer) -> "_Attached":
    return _Attached(spec, trainer)
