"""TRL's GRPOTrainer with speculative rollouts from a spectool draft, refreshed online.

    from spectool import RefreshSettings
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
  into TRL's own metrics (TensorBoard, W&B, `log_history`), reduced over the ranks;
- the refreshed draft, its optimizer and the refresh history go into every TRL checkpoint (the main
  process writes `checkpoint-N/spectool-draft`) and come back with `train(resume_from_checkpoint=...)`;
- under `accelerate launch` every rank's engine holds one draft: the refresher's gradients are
  averaged over the ranks and the drafts' digests compared after every push (spectool/ranks.py).
Refused up front: server mode (a frozen draft goes through `spectool export --for trl-serve`), sleep
mode on every build (spectool calls the engine outside TRL's wake windows: preflight.SLEEP_MODE_REFUSED),
a TRL outside the tested range.

The package: settings.py (the settings), trainer.py (SpectoolSpeculation: them, from_sweep and grpo_trainer), preflight.py
(refusals before anything starts), attach.py (what runs inside the trainer), data.py (task_data), internals.py (every
private TRL name, checked).
"""

from spectool.integrations.trl.data import task_data
from spectool.integrations.trl.internals import TESTED_TRL, check_trl_version
from spectool.integrations.trl.preflight import check_memory
from spectool.integrations.trl.trainer import MTP, SpectoolSpeculation

__all__ = ["MTP", "TESTED_TRL", "SpectoolSpeculation", "check_memory", "check_trl_version", "task_data"]
