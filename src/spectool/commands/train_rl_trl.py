"""`spectool train-rl --config rl.yaml` with `backend: trl`: the same run through TRL's GRPOTrainer.

setup -> loop -> save:
  setup  the policy, the prompts and spectool's verifier as TRL's dataset and reward function,
         rl.yaml's settings as a GRPOConfig (colocate vLLM), speculation through
         SpectoolSpeculation (the draft, k or a sweep's schedule, online refresh settings)
  loop   TRL's own train(): generation, GRPO update, weight sync (checked), draft refresh (pushed and
         checked), TRL checkpoints every `checkpoint_every` steps with the refreshed draft beside them
  save   metrics.jsonl (TRL's log lines), the resolved config, a manifest
A run directory resumes from TRL's last checkpoint, with the draft as it was saved there. From
here a user scales out the way TRL does (accelerate launch, DeepSpeed, FSDP, LoRA): none of it is
spectool's.
"""

from __future__ import annotations

import time
from pathlib import Path

from spectool.engine.compat import is_cpu_build
from spectool.errors import SpectoolError
from spectool.integrations.trl import SpectoolSpeculation, check_trl_version, task_data
from spectool.models import resolve_model
from spectool.rl.config import RESUMABLE_KEYS_IGNORED, RLConfig
from spectool.rl.speculation import resolve
from spectool.runs import MANIFEST, append_jsonl, atomic_write_json, claim, make_manifest, truncate_jsonl

TRL_DIR = "trl"  # TRL's output_dir inside the run folder (its checkpoints)
DRAFT_IN_CHECKPOINT = "spectool-draft"


def grpo_config(cfg: RLConfig, out: Path, cpu: bool):
    """rl.yaml's settings in TRL's names. One optimizer step = prompts_per_step x group_size
    sequences, in micro-batches of policy.micro_batch_size where that divides them."""
    from trl import GRPOConfig  # noqa: PLC0415 (TRL is the optional spectool[trl])

    r, p, e = cfg.rollout, cfg.policy, cfg.engine
    seqs = r.prompts_per_step * r.group_size
    micro = p.micro_batch_size if seqs % p.micro_batch_size == 0 and p.micro_batch_size % r.group_size == 0 else seqs
    return GRPOConfig(
        output_dir=str(out / TRL_DIR), seed=cfg.seed, max_steps=p.steps, learning_rate=p.lr,
        lr_scheduler_type="constant", per_device_train_batch_size=micro, gradient_accumulation_steps=seqs // micro,
        num_generations=r.group_size, max_completion_length=r.max_tokens, temperature=r.temperature,
        beta=p.kl_beta, epsilon=p.eps_low, epsilon_high=p.eps_high, max_grad_norm=p.max_grad_norm,
        scale_rewards="group" if p.scale_adv_by_std else "none", use_vllm=True, vllm_mode="colocate",
        vllm_gpu_memory_utilization=e.gpu_memory_utilization,  # the CPU build's share: engine.spectool_kwargs
        vllm_max_model_length=e.max_model_len or None, use_cpu=cpu, bf16=not cpu, logging_steps=1,
        report_to="none", save_strategy="steps", save_steps=cfg.checkpoint_every, save_only_model=False,
    )


def _speculation(cfg: RLConfig, model, saved_draft: str | None):
    """rl.yaml's speculation for TRL; `saved_draft`: the refreshed draft of the checkpoint resumed from."""

    e = cfg.engine
    common = dict(dtype=e.dtype, enforce_eager=e.enforce_eager, logprob_tolerance=cfg.policy.logprob_tolerance or None)
    spec = resolve(cfg, model)
    if spec.method == "mtp":
        raise SpectoolError("speculation.method: mtp with backend: trl is not offered by train-rl yet (its TRL "
                            "checkpoints would not carry the refreshed MTP layers); use backend: builtin, or the TRL "
                            "integration directly: SpectoolSpeculation(\"mtp\").grpo_trainer(...)")
    if spec.draft_path is None:  # plain decoding, with spectool's engine settings, weight sync and logprob guard
        return SpectoolSpeculation(None, **common)
    return SpectoolSpeculation(saved_draft or spec.draft_path, k=max(spec.k, 1), draft_sampling=spec.proposals,
                               k_schedule=spec.schedule, refresh=cfg.draft_refresh, seed=cfg.seed, **common)


def _last_checkpoint(out: Path) -> Path | None:
    found = sorted((out / TRL_DIR).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])) \
        if (out / TRL_DIR).exists() else []
    return found[-1] if found else None


def _callback(out: Path, trainer):
    """metrics.jsonl from TRL's log lines; the refreshed draft saved into every TRL checkpoint."""
    from transformers import TrainerCallback  # noqa: PLC0415 (heavy, loaded only on this path)

    class SpectoolRunFolder(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                append_jsonl(out / "metrics.jsonl", {"step": state.global_step, **logs})

        def on_save(self, args, state, control, **kw):
            ref = getattr(getattr(trainer, "spectool", None), "refresher", None)
            if ref is not None:
                import torch  # noqa: PLC0415 (heavy, loaded only on this path)

                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}" / DRAFT_IN_CHECKPOINT
                ref.save(folder, rl_step=state.global_step)
                torch.save(ref.state_dict(), folder / "refresher.pt")

    return SpectoolRunFolder()


def run(cfg: RLConfig) -> dict:
    """The whole run; returns the summary written into the manifest."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)

    cfg.validate()
    version = check_trl_version()
    out, model = Path(cfg.out), resolve_model(cfg.model)
    ckpt = _last_checkpoint(out)
    saved_draft = ckpt / DRAFT_IN_CHECKPOINT if ckpt else None
    spec = _speculation(cfg, model, str(saved_draft) if saved_draft and saved_draft.exists() else None)
    ds, reward = task_data(cfg.data, min(cfg.policy.steps * cfg.rollout.prompts_per_step, 4096), cfg.seed)
    claim(out, "train-rl", cfg.as_dict(), may_change=RESUMABLE_KEYS_IGNORED, flag="out")
    truncate_jsonl(out / "metrics.jsonl", int(ckpt.name.split("-")[1]) if ckpt else 0)
    args = grpo_config(cfg, out, cpu=is_cpu_build() or not torch.cuda.is_available())
    trainer = spec.grpo_trainer(model=model.path, reward_funcs=reward, args=args, train_dataset=ds)
    if trainer.spectool.refresher is not None and saved_draft and (saved_draft / "refresher.pt").exists():
        trainer.spectool.refresher.load_state_dict(torch.load(saved_draft / "refresher.pt", weights_only=False))
    trainer.add_callback(_callback(out, trainer))
    t = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    summary = _summary(trainer, time.perf_counter() - t)
    atomic_write_json(out / MANIFEST, make_manifest(
        "train-rl", backend="trl", trl_version=version, model=model.name, model_identity=model.identity, data=cfg.data,
        steps=cfg.policy.steps, resumed_from=int(ckpt.name.split("-")[1]) if ckpt else 0,
        draft=spec.draft, k=cfg.speculation.k,
        draft_mode=cfg.draft_refresh.mode if spec.draft else "no speculation", summary=summary))
    return summary


def _summary(trainer, seconds: float) -> dict:
    logs = [h for h in trainer.state.log_history if "loss" in h]

    def mean(key):
        vals = [h[key] for h in logs if key in h]
        return sum(vals) / len(vals) if vals else None

    return {"steps": len(logs), "seconds": seconds, "mean_reward": mean("reward"),
            "mean_acceptance_length": mean("spectool/acceptance_length"), "mean_step_s": mean("step_time"),
            "max_logprob_check": max((h["spectool/logprob_check_max_diff"] for h in logs
                                      if "spectool/logprob_check_max_diff" in h), default=None)}
