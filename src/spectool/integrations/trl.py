"""TRL's GRPOTrainer with speculative rollouts from a spectool draft, refreshed online.

    from spectool.integrations.trl import SpectoolSpeculation
    spec = SpectoolSpeculation("runs/demo/export", k=3, refresh=RefreshSettings(every=1))
    trainer = spec.grpo_trainer(model=POLICY, reward_funcs=..., args=GRPOConfig(use_vllm=True, ...),
                                train_dataset=...)
    trainer.train()

What it does to stock TRL (tested: trl 1.16, colocate mode), all from outside TRL:
- the colocated `vllm.LLM(...)` TRL builds (it takes no engine arguments) gets spectool's
  additions while the trainer is constructed: the draft's speculative_config, spectool's worker
  extension (the CPU sampler fix, weight reloads, the draft probe), the counters, the dtype;
- the policy sync: on the CPU build through spectool's reload (TRL's per-tensor `load_weights`
  fails there in float32 and leaves the packed lm_head stale), on a GPU TRL's own; after every
  sync the engine's logprobs are checked against the trainer's and the run stops beyond the
  dtype's tolerance (TRL's `sampling_logp_difference` is a metric, not a guard);
- a `DraftRefresher` captures features from TRL's own loss forward (labels mark the completion),
  refreshes the draft as `refresh` says (spectool.RefreshSettings: every N steps, or when it pays), pushes it
  into the engine and proves it took;
- acceptance length, per-position acceptance, draft loss, refresh time and the logprob check go
  into TRL's own metrics (TensorBoard, W&B, `log_history`).
Refused up front: server mode (a frozen draft goes through `spectool export --for trl-serve`), sleep
mode (level 2 drops the drafter's weights and vLLM does not restore them: vllm#52479), a TRL
outside the tested range.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from spectool.constants import DEFAULT_K, K_MAX, K_MIN, k_in_range
from spectool.draft.refresh import RefreshSettings
from spectool.errors import SpectoolError

log = logging.getLogger(__name__)

TESTED_TRL = ("1.16.0", "1.17.0")  # [from, to): the releases this integration was run against
CHECK_ROWS = 2  # sequences of the last training batch whose logprobs are checked after each sync


def check_trl_version(version: str | None = None) -> str:
    """The installed TRL, refused outside TESTED_TRL with the range and the install command."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    from spectool.engine.compat import parse_version

    try:
        version = version or dist_version("trl")
    except PackageNotFoundError:
        raise SpectoolError("TRL is not installed: pip install 'spectool[trl]'") from None
    lo, hi = (parse_version(v) for v in TESTED_TRL)
    if not lo <= parse_version(version) < hi:
        raise SpectoolError(f"TRL {version} is outside the versions spectool's TRL integration was tested with "
                            f"(>= {TESTED_TRL[0]}, < {TESTED_TRL[1]}): pip install 'spectool[trl]'")
    return version


MTP = "mtp"  # SpectoolSpeculation(draft=MTP): the policy's own MTP layers draft


@dataclass
class SpectoolSpeculation:
    """Speculative rollouts with a spectool draft inside TRL's GRPOTrainer (colocate mode)."""

    draft: str | None
    """A spectool draft or export folder (init-draft / export; EAGLE-3, P-EAGLE or DFlash: its family is
    read from the folder), made for the trained policy; "mtp":
    the policy's own MTP layers (a MiMo-layout model); None: plain decoding with spectool's engine
    settings, policy sync and logprob guard (a baseline)."""
    k: int = DEFAULT_K
    """Draft tokens per verify step."""
    draft_sampling: str = "auto"
    """auto (per build by measurement, engine/proposals.py) | greedy | probabilistic: how the draft proposes (all exact)."""
    k_schedule: list[tuple[int, int, int]] | None = None
    """Per batch size k, [(batch_from, batch_to, k)] (sweep-k / forecast's recommendation)."""
    refresh: RefreshSettings = field(default_factory=RefreshSettings)
    """How and when the draft refreshes (spectool.RefreshSettings, rl.yaml's draft_refresh section): mode frozen |
    online (every `every` optimizer steps) | auto, its steps, learning rate, unroll, batch, buffer and loss."""
    seed: int = 0
    """The refresher's sampling seed."""
    dtype: str = "auto"
    """The engine's dtype: auto (float32 on the CPU build, bfloat16 on a GPU) | float32 | bfloat16."""
    enforce_eager: bool = False
    """True: no torch.compile in the engine (faster start, slower decode)."""
    policy_sync: str = "auto"
    """auto (spectool's reload on the CPU build, TRL's own on a GPU) | spectool | trl."""
    logprob_tolerance: float | None = None
    """Max |engine - trainer| logprob after a sync (None: by the engine's dtype, precision.py)."""

    @classmethod
    def from_sweep(cls, sweep: str, draft: str | None = None, draft_sampling: str = "auto",
                   **settings: Any) -> "SpectoolSpeculation":
        """k per batch size from a sweep-k run (with the draft it measured) or a forecast (give
        the draft); vLLM then picks k by the live batch size as TRL's batch shrinks into its tail."""
        from spectool.engine.proposals import resolve
        from spectool.schedule import read_schedule

        draft_sampling = resolve(draft_sampling)[0]
        schedule, folder = read_schedule(sweep, draft, draft_sampling, flag="")
        if max(k for _, _, k in schedule) == 0:
            raise SpectoolError(f"sweep {sweep} recommends no speculation at any batch size; use draft=None")
        return cls(folder, k=max(k for _, _, k in schedule), draft_sampling=draft_sampling, k_schedule=schedule,
                   **settings)

    def validate(self) -> None:
        from spectool.constants import DRAFT_SAMPLING

        if not k_in_range(self.k):
            raise SpectoolError(f"k = {self.k}: must be in [{K_MIN}, {K_MAX}]")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise SpectoolError(f"draft_sampling = {self.draft_sampling!r}: one of {', '.join(DRAFT_SAMPLING)}")
        self.refresh.validate("refresh.")
        if self.policy_sync not in ("auto", "spectool", "trl"):
            raise SpectoolError(f"policy_sync = {self.policy_sync!r}: auto, spectool or trl")

    def grpo_trainer(self, trainer_cls=None, **trainer_kwargs):
        """Build TRL's GRPOTrainer (or a subclass) with speculative rollouts; refuses what cannot
        work before anything starts. Returns the trainer, ready for `train()`."""
        check_trl_version()
        self.validate()
        from trl import GRPOTrainer

        trainer_cls = trainer_cls or GRPOTrainer
        args = trainer_kwargs.get("args")
        _check_args(args)
        if self.draft is not None:
            _check_draft(self, trainer_kwargs.get("model"), args)
        if torch.cuda.is_available():  # before TRL puts the policy or the engine on the GPU
            check_memory(self, args, trainer_kwargs)
        with _speculative_llm(self):
            trainer = trainer_cls(**trainer_kwargs)
        _Attached(self, trainer)
        return trainer


def _check_args(args) -> None:
    if args is None or not getattr(args, "use_vllm", False):
        raise SpectoolError("speculative rollouts need TRL's vLLM generation: GRPOConfig(use_vllm=True, "
                            "vllm_mode='colocate')")
    if args.vllm_mode != "colocate":
        raise SpectoolError(f"vllm_mode = {args.vllm_mode!r}: spectool's online refresh works in TRL's colocate mode. "
                            "For server mode, serve a frozen draft: spectool export --for trl-serve prints the "
                            "`trl vllm-serve --speculative_config` line")
    if args.vllm_enable_sleep_mode:
        raise SpectoolError("vllm_enable_sleep_mode = True: TRL sleeps the engine at level 2, which drops the drafter's "
                            "weights, and vLLM does not restore them (vllm#52479): the drafter would be dead while "
                            "outputs stay right. Set vllm_enable_sleep_mode=False")
    if args.vllm_tensor_parallel_size != 1:
        raise SpectoolError("vllm_tensor_parallel_size > 1 with a refreshed draft is untested; use 1 (data parallel "
                            "over accelerate processes works: each process has its own engine)")


def _check_draft(spec: SpectoolSpeculation, model, args) -> None:
    """The draft against the policy TRL will train (draft.checkpoint.check_draft: the policy's fingerprint, the
    positions trained for k), before any engine starts."""
    from spectool.draft.checkpoint import check_draft
    from spectool.models import resolve_model

    path = model if isinstance(model, str) else getattr(model, "name_or_path", None)
    k = max([spec.k] + [k for _, _, k in spec.k_schedule or []])
    if spec.draft == MTP:
        from spectool.draft.mtp_folder import load_mtp

        if not path:
            raise SpectoolError('draft="mtp" needs the model as a folder path (its MTP layers are read from it)')
        load_mtp(resolve_model(path).path, flag='draft="mtp"')
    elif path:
        check_draft(spec.draft, resolve_model(path), k, flag="draft", k_flag="k =")
    if path:
        _check_positions(spec, resolve_model(path).path, args)


def _check_positions(spec: SpectoolSpeculation, model_path: str, args) -> None:
    """TRL's longest sequence (max_prompt_length + max_completion_length, where this TRL has the former)
    against the drafter's position range (draft/preflight.py)."""
    from spectool.draft.preflight import check_positions, draft_position_range

    mtp = spec.draft == MTP
    have = draft_position_range(None if mtp else str(spec.draft), model_path, MTP if mtp else "eagle3", None)
    need = (getattr(args, "max_prompt_length", None) or 0) + (getattr(args, "max_completion_length", None) or 0)
    check_positions(need, have, "the mtp layers' policy" if mtp else str(spec.draft),
                    "GRPOConfig's max_prompt_length + max_completion_length")


def check_memory(spec: SpectoolSpeculation, args, trainer_kwargs: dict, total_bytes: int | None = None) -> None:
    """Print the plan of one GPU (TRL's policy and its colocated engine, memory.trl_plan); refuse
    one that cannot fit when nothing shards or shrinks the trainer (one process, no DeepSpeed or
    FSDP, no PEFT), where the arithmetic is plain."""
    import os

    from transformers import AutoConfig

    from spectool.memory import draft_params, trl_plan
    from spectool.models import resolve_config, resolve_model

    model = trainer_kwargs.get("model")
    if isinstance(model, str):  # a folder is read by its config alone; a name is resolved as TRL would load it
        path = (resolve_config if os.path.isdir(model) else resolve_model)(model).path
        config = AutoConfig.from_pretrained(path)
        dtype = (args.model_init_kwargs or {}).get("dtype", "auto")
        dtype = getattr(config, "dtype", None) if dtype in (None, "auto") else dtype
        param_bytes = (getattr(torch, dtype) if isinstance(dtype, str) else dtype or torch.float32).itemsize
    else:
        path, config = getattr(model, "name_or_path", None), model.config
        param_bytes = next(model.parameters()).element_size()
    sharded, world = bool(args.deepspeed or args.fsdp), int(os.environ.get("WORLD_SIZE", "1"))
    peft = trainer_kwargs.get("peft_config") is not None
    mtp = spec.draft == MTP
    draft = 0
    if spec.draft and spec.refresh.refreshes:  # a refreshed draft trains beside the policy
        draft = draft_params(path if mtp else spec.draft, mtp)
    prompt = _longest_prompt(trainer_kwargs, path)
    plan = trl_plan(config, param_bytes=param_bytes, engine_share=args.vllm_gpu_memory_utilization,
                    total_bytes=total_bytes or torch.cuda.get_device_properties(0).total_memory,
                    micro_tokens=args.per_device_train_batch_size * (prompt + args.max_completion_length),
                    ref_model=args.beta != 0, shards=world if sharded else 1,
                    trainable_fraction=0.0 if peft else 1.0, checkpointing=bool(args.gradient_checkpointing),
                    draft_params=draft, draft_embedding=not mtp)
    plan.notes.append(f"activations: the longest of the first {PROMPTS_MEASURED} prompts ({prompt} tokens) + "
                      "max_completion_length" if prompt else "activations count completions only (no prompts read)")
    if peft:
        plan.notes.append("PEFT: the adapters' gradients and AdamW are not counted")
    if sharded or peft or world > 1:
        plan.notes.append("not enforced: DeepSpeed/FSDP, PEFT or several processes change the arithmetic")
        log.info(plan.text())
        return
    plan.check("TRL's GRPOTrainer cannot fit this on one GPU: lower vllm_gpu_memory_utilization, "
               "per_device_train_batch_size or max_completion_length, set gradient_checkpointing=True, beta=0.0, "
               "or shard the policy (accelerate launch with DeepSpeed ZeRO-3 or FSDP) or train LoRA adapters")
    log.info(plan.text())


PROMPTS_MEASURED = 256  # dataset prompts tokenized for the memory plan's sequence length


def _longest_prompt(trainer_kwargs: dict, path: str | None) -> int:
    """Tokens of the longest of the train dataset's first prompts as TRL renders them (chat
    template for conversational prompts); 0 when there is no dataset or tokenizer to read."""
    data, tok = trainer_kwargs.get("train_dataset"), trainer_kwargs.get("processing_class")
    if data is None or "prompt" not in getattr(data, "column_names", []):
        return 0
    if tok is None:
        if not path:
            return 0
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):  # a folder with a config alone
            return 0
    from spectool.prompts import encode_messages

    prompts = data.select(range(min(PROMPTS_MEASURED, len(data))))["prompt"]  # conversational: lists of messages
    return max(len(encode_messages(tok, p) if isinstance(p, list) else tok(p)["input_ids"]) for p in prompts)


@contextlib.contextmanager
def _speculative_llm(spec: SpectoolSpeculation):
    """While the trainer is built: TRL's `LLM` name points at a wrapper adding spectool's kwargs."""
    import trl.generation.vllm_generation as vg

    from spectool.engine.engine import (
        EngineConfig,
        check_exact_verification,
        default_max_len,
        prepare_environment,
        spectool_kwargs,
    )

    real = vg.LLM

    def speculative_llm(*args: Any, **kwargs: Any):
        from spectool.draft.families import folder_family

        mtp = spec.draft == MTP
        method = "mtp" if mtp else (spec.draft and folder_family(spec.draft)) or "eagle3"  # the folder's family
        ecfg = EngineConfig(model_path=kwargs.get("model", ""), draft_path=None if mtp else spec.draft and str(spec.draft),
                            method=method, k=spec.k,
                            k_schedule=spec.k_schedule, draft_sampling=spec.draft_sampling, dtype=spec.dtype,
                            enforce_eager=spec.enforce_eager)
        cpu = prepare_environment(ecfg)
        kwargs.update(spectool_kwargs(ecfg, cpu))
        check_exact_verification(kwargs.get("speculative_config"), where="TRL's engine:")
        if kwargs.get("max_model_len") is None:  # GRPOConfig.vllm_max_model_length unset: TRL's 4096-token
            kwargs["max_model_len"] = default_max_len(ecfg.model_path)  # batches must hold a whole prompt
        return real(*args, **kwargs)

    vg.LLM = speculative_llm
    try:
        yield
    finally:
        vg.LLM = real


class _Attached:
    """spectool's pieces on a built GRPOTrainer: sync + check, refresher, callback, metrics."""

    def __init__(self, spec: SpectoolSpeculation, trainer):
        from transformers import TrainerCallback

        from spectool.draft.refresh import DraftRefresher
        from spectool.engine import colocated
        from spectool.engine.compat import support
        from spectool.precision import logprob_tolerance

        self.spec, self.trainer = spec, trainer
        self.vg = trainer.vllm_generation
        self.llm = self.vg.llm
        self.dtype = colocated.served_dtype(self.llm)
        self.tolerance = logprob_tolerance(spec.logprob_tolerance, self.dtype)
        fix = self.llm.collective_rpc("spectool_sampler_fix")[0]
        if support().cpu_build and fix != "applied":
            raise SpectoolError(f"the CPU rejection-sampler fix is not active in TRL's engine ({fix}): speculative "
                                "samples would not be the policy's")
        use_spectool = spec.policy_sync == "spectool" or (spec.policy_sync == "auto" and support().cpu_build)
        self._trl_sync = self.vg.sync_weights
        self.vg.sync_weights = self._sync_spectool if use_spectool else self._sync_trl
        self.refresher = None
        if spec.refresh.refreshes and spec.draft == MTP:
            self.refresher = DraftRefresher.from_mtp(trainer.model.name_or_path, trainer.model, spec.refresh,
                                                     seed=spec.seed)
        elif spec.refresh.refreshes and spec.draft:
            self.refresher = DraftRefresher.from_folder(spec.draft, trainer.model, spec.refresh, seed=spec.seed)

        self.cadence = spec.refresh.policy()
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

        trainer.add_callback(SpectoolCallback())
        trainer.spectool = self  # for users and tests: the refresher, the engine, the metrics

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
        from spectool.engine import colocated
        from spectool.engine.probe import torch_dtype

        dt = torch_dtype(self.dtype)  # one host copy per tensor, taken while TRL holds it gathered / merged
        state = ((name, p.detach().to("cpu", dt, copy=True)) for name, p in self.vg._iter_named_params())
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
        from spectool.engine import colocated

        if self._rows is None:  # the first sync comes before any training forward
            return
        seqs = [ids[m.bool()].tolist() for ids, m in zip(*self._rows)]
        prompts, resps = [s[:1] for s in seqs], [s[1:] for s in seqs]
        got = colocated.sequence_logprobs(self.llm, prompts, resps)
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        from spectool.precision import logprob_gaps

        want = []
        with torch.no_grad(), self.trainer.accelerator.autocast():
            for s in seqs:
                ids = torch.tensor([s], device=model.device)
                lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
                want.append(lp.gather(-1, ids[0, 1:, None])[:, 0].tolist())
        mean, worst = logprob_gaps(got, want)
        self._log("logprob_check_mean_diff", mean)
        self._log("logprob_check_max_diff", worst)
        if not mean <= self.tolerance:
            raise SpectoolError(
                f"after TRL's weight sync the engine's logprobs differ from the trainer's by {mean:.3g} nats on average "
                f"(max {worst:.3g}; > {self.tolerance} for a {self.dtype} engine): the engine is not running the trained "
                "weights. "
                "TRL's last checkpoint is intact; try policy_sync='spectool' (or 'trl'), or set logprob_tolerance "
                "if the engine runs in lower precision than the trainer")

    # --- per step ---------------------------------------------------------------------------------

    def on_step_end(self, step: int) -> None:
        from spectool.engine import colocated

        now = colocated.acceptance(self.llm)
        delta, self._counters = now - self._counters, now
        if delta.num_drafts:
            self._log("acceptance_length", delta.mean_acceptance_length)
            for i, rate in enumerate(delta.per_position_rate):
                self._log(f"acceptance_pos{i + 1}", rate)
        if self.refresher is None:
            return
        if self.pending_check:
            self.refresher.check_acceptance(delta)
            self.pending_check = False
        staleness = self.cadence.observe(delta.mean_acceptance_length if delta.num_drafts else None, self.gen_s)
        self._log("staleness", staleness)
        self.gen_s = 0.0
        if self.cadence.due(step) and self.refresher.online.buffer:
            t = time.perf_counter()
            rep = self.refresher.refresh(self.spec.refresh.steps_per_refresh)
            pushed = self.refresher.push(self.llm)
            spent = time.perf_counter() - t
            self.cadence.refreshed(spent)
            self.pending_check = True
            self._log("draft_loss", rep.loss)
            self._log("draft_top1_pos1", rep.top1_after[0])
            self._log("draft_check_excess", pushed.max_excess)
            self._log("refresh_s", spent)
            self.history.append({"step": step, "reason": self.cadence.reason, "loss": rep.loss, "check_excess": pushed.max_excess,
                                 "has_power": pushed.has_power})

    def _log(self, key: str, value: float) -> None:
        """Into TRL's own metrics: averaged and logged with TRL's at its next log step."""
        self.trainer._metrics["train"][f"spectool/{key}"].append(float(value))


def task_data(data: str, n: int, seed: int = 0, split: str = "train"):
    """A spectool data source as TRL wants it: a `datasets.Dataset` of chat prompts (with a
    `task_id` column) and a reward function scoring completions with the source's own verifier."""
    from datasets import Dataset

    from spectool.data import load_source

    source = load_source(data, seed=seed)
    if not source.verifiable:
        raise SpectoolError(f"data {data} has no verifier: GRPO needs rewards (use gym:... or a file with answers)")
    tasks = {t.id: t for t in source.tasks(split, n)}
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}], "task_id": t.id} for t in tasks.values()])

    def spectool_reward(prompts, completions, task_id, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [source.score(tasks[i], text) for i, text in zip(task_id, texts)]

    return ds, spectool_reward
