"""A user's own TRL script with spectool (the library face), run by tests/test_trl_ranks.py under
`accelerate launch` with 1 or 2 processes: GRPO with a draft refreshed every step, TRL
checkpoints, and with --resume TRL's resume. Each rank writes what it saw into OUT/rank{r}.json:
its draft's digest and optimizer state when training began (after any restore) and ended, the
refresh history, TRL's logged rows.

    python trl_ranks.py OUT POLICY DRAFT DATA STEPS [--resume]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import GRPOConfig

from spectool import RefreshSettings, ranks
from spectool.integrations.trl import SpectoolSpeculation, task_data


def own_state(trainer) -> dict:
    """The draft's own weights and its AdamW moments, as digests (what a checkpoint must carry)."""
    ref = trainer.spectool.refresher
    weights = {k: v for k, v in ref.draft.state_dict().items() if not k.startswith("embed_tokens.")}
    moments = {f"{i}.{k}": v for i, s in ref.online.opt.state_dict()["state"].items() for k, v in s.items()}
    return {"weights": ranks.digest(weights), "moments": ranks.digest(moments), "draft_steps": ref.online.steps,
            "refreshes": len(trainer.spectool.history)}


def main(out: str, policy: str, draft: str, data: str, steps: int, resume: bool) -> None:
    ds, reward = task_data(data, 64)
    args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=16, max_steps=steps, logging_steps=1, report_to="none", use_vllm=True,
                      vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, beta=0.0, learning_rate=1e-3,
                      save_strategy="steps", save_steps=2, seed=0)
    spec = SpectoolSpeculation(draft, k=2, enforce_eager=True,
                               refresh=RefreshSettings(every=1, steps_per_refresh=3, lr=3e-3, warmup_steps=0,
                                                       batch_size=4))
    trainer = spec.grpo_trainer(model=policy, reward_funcs=reward, args=args, train_dataset=ds)
    seen: dict = {}

    class Begin(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            seen["begin"] = own_state(trainer)

    trainer.add_callback(Begin())
    trainer.train(resume_from_checkpoint=True if resume else None)
    rows = [{k: v for k, v in h.items() if k.startswith("spectool/") or k == "step"}
            for h in trainer.state.log_history if "loss" in h]
    record = {"world": ranks.world(), "begin": seen["begin"], "end": own_state(trainer),
              "pushed": ranks.digest(trainer.spectool.refresher.draft.export_state_dict()),
              "history": trainer.spectool.history, "rows": rows}
    Path(out, f"rank{ranks.rank()}.json").write_text(json.dumps(record, indent=1))
    torch.distributed.destroy_process_group() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], a[3], int(a[4]), "--resume" in a)
