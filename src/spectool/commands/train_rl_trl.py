"""`spectool train-rl --config rl.yaml` with `backend: trl`: the same run through TRL's GRPOTrainer.

setup -> loop -> save:
  setup  the policy, the prompts and spectool's verifier as TRL's dataset and reward function,
         rl.yaml's settings as a GRPOConfig (colocate vLLM), speculation through
         SpectoolSpeculation (the draft, k or a sweep's schedule, online refresh settings)
  loop   TRL's own train(): generation, GRPO update, weight sync (checked), draft refresh (pushed and
         checked), TRL checkpoints every `checkpoint_every` steps with the refreshed draft inside them
         (the integration's own: integrations/trl/attach.py)
  save   metrics.jsonl (TRL's log lines), the resolved config, a manifest
A run directory resumes from TRL's last checkpoint, with the draft as it was saved there. Under
`accelerate launch --num_processes N` each process is a data-parallel rank with its own colocated
engine: the step's sequences are split over the ranks, the draft stays one (integrations/trl), and
the main process alone writes the run folder. The rest of scale-out (DeepSpeed, FSDP, LoRA) is TRL's.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from spectool import ranks, trackers
from spectool.context import RL_YAML
from spectool.engine.compat import is_cpu_build
from spectool.errors import SpectoolError
from spectool.integrations.trl import MTP, SpectoolSpeculation, check_trl_version, task_data
from spectool.models import resolve_model
from spectool.prompts import template_kwargs
from spectool.rl.config import RESUMABLE_KEYS_IGNORED, RLConfig
from spectool.rl.speculation import resolve
from spectool.runs import MANIFEST, append_jsonl, atomic_write_json, claim, make_manifest, truncate_jsonl
from spectool.settings.engine import EngineSettings, values

TRL_DIR = "trl"  # TRL's output_dir inside the run folder (its checkpoints)


def grpo_config(cfg: RLConfig, out: Path, cpu: bool, world: int = 1):
    """rl.yaml's settings in TRL's names. One optimizer step = prompts_per_step x group_size
    sequences over all `world` processes, each in micro-batches of policy.micro_batch_size where
    that divides its share."""
    from trl import GRPOConfig  # noqa: PLC0415 (TRL is the optional spectool[trl])

    r, p, e = cfg.rollout, cfg.policy, cfg.engine
    seqs = r.prompts_per_step * r.group_size
    if seqs % world:
        raise SpectoolError(f"rollout.prompts_per_step x rollout.group_size = {seqs} sequences a step cannot be split "
                            f"over {world} processes: make it a multiple of {world}, or launch fewer processes")
    share = seqs // world
    micro = p.micro_batch_size if share % p.micro_batch_size == 0 and p.micro_batch_size % r.group_size == 0 else share
    return GRPOConfig(
        output_dir=str(out / TRL_DIR), seed=cfg.seed, max_steps=p.steps, learning_rate=p.lr,
        lr_scheduler_type="constant", per_device_train_batch_size=micro, gradient_accumulation_steps=share // micro,
        num_generations=r.group_size, max_completion_length=r.max_tokens, temperature=r.temperature,
        beta=p.kl_beta, epsilon=p.eps_low, epsilon_high=p.eps_high, max_grad_norm=p.max_grad_norm,
        scale_rewards="group" if p.scale_adv_by_std else "none", use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=e.gpu_memory_utilization,  # the CPU build's share: engine.spectool_kwargs
        vllm_max_model_length=e.max_model_len or None, use_cpu=cpu, bf16=not cpu and _trainer_bf16(e.dtype),
        logging_steps=1, chat_template_kwargs=template_kwargs(r.chat_template_kwargs) or None,  # as spectool renders
        save_strategy="steps", save_steps=cfg.checkpoint_every, save_only_model=False,
        # rl.yaml's report_to: TRL's own callbacks log its log lines (metrics.jsonl's) there, under the run name and
        # trackio project the built-in loop uses (tensorboard's events in <out>/tensorboard: `tensorboard_folder`)
        report_to=trackers.parse(cfg.report_to, "report_to") or "none", run_name=trackers.run_name(out),
        project=trackers.PROJECT,
    )


@contextlib.contextmanager
def tensorboard_folder(cfg: RLConfig, out: Path):
    """While the trainer is built: with report_to tensorboard, transformers' TensorBoardCallback (which reads
    TENSORBOARD_LOGGING_DIR when it is made) writes into <out>/tensorboard, where the built-in loop writes (its default,
    <out>/trl/runs/<date>_<host>, is a new run each launch: a resumed run would show as two); a TENSORBOARD_LOGGING_DIR
    the user set is kept, and the environment is given back as it was."""
    before = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if before is None and "tensorboard" in trackers.parse(cfg.report_to, "report_to"):
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(out / "tensorboard")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TENSORBOARD_LOGGING_DIR", None)


def _trainer_bf16(engine: str) -> bool:
    """Whether TRL's trainer runs in bfloat16: where spectool's own trainer would (precision.trainer_dtype), not
    below compute capability 8.0, whose float16 engine leaves the trainer in float32."""
    from spectool.precision import engine_dtype, trainer_dtype  # noqa: PLC0415 (torch, loaded only on this path)

    return trainer_dtype(engine_dtype(engine)) == "bfloat16"


def speculation_for(cfg: RLConfig, model):
    """rl.yaml's speculation for TRL (a resumed run's refreshed draft comes from TRL's checkpoint)."""

    e = cfg.engine
    common = dict(values(e, EngineSettings), logprob_tolerance=cfg.policy.logprob_tolerance or None)
    spec = resolve(cfg, model)
    if spec.draft_path is None:  # plain decoding, with spectool's engine settings, weight sync and logprob guard
        return SpectoolSpeculation(None, **common)
    draft = MTP if spec.method == "mtp" else spec.draft_path  # MTP: the policy's own layers, refreshed like a draft
    return SpectoolSpeculation(draft, k=max(spec.k, 1), draft_sampling=spec.draft_sampling,  # auto stays auto
                               k_schedule=spec.schedule, refresh=cfg.draft_refresh, seed=cfg.seed, **common)


def _last_checkpoint(out: Path) -> Path | None:
    found = sorted((out / TRL_DIR).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])) \
        if (out / TRL_DIR).exists() else []
    return found[-1] if found else None


def _callback(out: Path):
    """metrics.jsonl from TRL's log lines (the main process's: TRL's metrics are reduced over the ranks)."""
    from transformers import TrainerCallback  # noqa: PLC0415 (heavy, loaded only on this path)

    class SpectoolRunFolder(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and state.is_world_process_zero:
                append_jsonl(out / "metrics.jsonl", {"step": state.global_step, **logs})

    return SpectoolRunFolder()


def run(cfg: RLConfig) -> dict:
    """The whole run, on every process `accelerate launch` starts; returns the summary written into the manifest."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)

    cfg.validate()
    version = check_trl_version()
    out, model = Path(cfg.out), resolve_model(cfg.model)
    ckpt = _last_checkpoint(out)
    spec = speculation_for(cfg, model)
    ds, reward = task_data(cfg.data, min(cfg.policy.steps * cfg.rollout.prompts_per_step, 4096), cfg.seed,
                           system_prompt=cfg.rollout.system_prompt, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col)
    # TRL's arguments start accelerate's process group (gloo on the CPU, NCCL on GPUs) when launched with several
    args = grpo_config(cfg, out, cpu=is_cpu_build() or not torch.cuda.is_available(),
                       world=int(os.environ.get("WORLD_SIZE", "1")))
    # every refusal of grpo_trainer (the lengths named in rl.yaml's keys), before the folder is claimed
    spec.check(RL_YAML, model=model.path, args=args, train_dataset=ds)

    def own_folder() -> None:  # the main process owns the run folder; the others stop with it if it is refused
        claim(out, "train-rl", cfg.as_dict(), may_change=RESUMABLE_KEYS_IGNORED, flag="out")
        truncate_jsonl(out / "metrics.jsonl", int(ckpt.name.split("-")[1]) if ckpt else 0)

    ranks.claim_folder(out, own_folder, flag="out")  # and every rank sees it (across nodes: a shared filesystem)
    with tensorboard_folder(cfg, out):
        trainer = spec.grpo_trainer(model=model.path, reward_funcs=reward, args=args, train_dataset=ds)
    trainer.add_callback(_callback(out))
    t = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    summary = _summary(trainer, time.perf_counter() - t)
    if ranks.rank() == 0:
        atomic_write_json(out / MANIFEST, make_manifest(
            "train-rl", backend="trl", trl_version=version, model=model.name, model_identity=model.identity,
            data=cfg.data, steps=cfg.policy.steps, resumed_from=int(ckpt.name.split("-")[1]) if ckpt else 0,
            processes=ranks.world(), draft=spec.draft, k=cfg.speculation.k,
            draft_mode=cfg.draft_refresh.mode if spec.draft else "no speculation", summary=summary))
    return summary


def _summary(trainer, seconds: float) -> dict:
    logs = [h for h in trainer.state.log_history if "loss" in h]

    def mean(key):
        vals = [h[key] for h in logs if key in h]
        return sum(vals) / len(vals) if vals else None

    return {"steps": len(logs), "seconds": seconds, "mean_reward": mean("reward"),
            "mean_acceptance_length": mean("spectool/acceptance_length"), "mean_step_s": mean("step_time"),
            "completions_cut_share": mean("completions/clipped_ratio"),  # TRL's: ended at max_completion_length
            "max_logprob_check": max((h["spectool/logprob_check_max_diff"] for h in logs
                                      if "spectool/logprob_check_max_diff" in h), default=None)}
