"""The train-rl trainer side (policy GRPO step + online draft refresh) on whatever device torch
sees, for a GPU box without vLLM: checks that gradients are bit-identical with the draft refresh on
and off there too, and times one policy update and one draft refresh step.

  PYTHONPATH=src python benchmarks/gpu_trainer_check.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import new_draft
    from spectool.draft.refresh import DraftRefresher, RefreshSettings
    from spectool.hidden import default_aux_layer_ids
    from spectool.rl.policy import PolicyTrainer, Rollout

    from conftest import make_policy

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print("device:", torch.cuda.get_device_name(0) if dev == "cuda" else "cpu")
    folder = make_policy(Path(tempfile.mkdtemp()) / "policy", layers=4, hidden=256)
    policy = AutoModelForCausalLM.from_pretrained(folder)
    g = torch.Generator().manual_seed(0)
    rollouts = []
    for i in range(32):
        p = torch.randint(10, 500, (40,), generator=g).tolist()
        r = torch.randint(10, 500, (60 + i,), generator=g).tolist()
        rollouts.append(Rollout(p, r, [-6.0] * len(r), float(i % 2), 1.0 if i % 2 else -1.0))
    grads = {}
    for mode in ("on", "off"):
        t = PolicyTrainer(str(folder), 1e-4, 1.0, 0.2, 0.2, 0.0, 8, 1.0, seed=0)
        torch.manual_seed(0)
        d = new_draft(policy, torch.arange(0, policy.config.vocab_size, 2), default_aux_layer_ids(4))
        refresher = DraftRefresher(d, t.model, RefreshSettings(lr=1e-3, warmup_steps=0, ttt_steps=5)) if mode == "on" else None
        for step in range(2):
            t0 = time.perf_counter()
            t.update(rollouts, capture=refresher.capture if refresher else None)
            if dev == "cuda":
                torch.cuda.synchronize()
            upd = time.perf_counter() - t0
            if refresher is not None:
                t0 = time.perf_counter()
                r = refresher.refresh(4)
                if dev == "cuda":
                    torch.cuda.synchronize()
                print(f"step {step}: update {upd:.3f} s, refresh (4 draft steps) {time.perf_counter() - t0:.3f} s, "
                      f"draft loss {r.loss:.3f}, top1 {r.top1_before[0]:.3f} -> {r.top1_after[0]:.3f}")
        grads[mode] = [p.grad.detach().cpu().clone() for p in t.unwrapped.parameters()]
        print(f"policy parameters on {next(t.unwrapped.parameters()).device}")
    same = all(torch.equal(a, b) for a, b in zip(grads["on"], grads["off"]))
    print("policy gradients bit-identical with refresh on and off:", same)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
