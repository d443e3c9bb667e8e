"""The memory plan's trainer rows (memory.train_rl_plan) against one real GRPO policy update, side by
side: what the first `PolicyTrainer.update` adds to memory (gradients, AdamW moments, autocast
copies, activations) as the plan predicts it and as measured, over micro-batch sizes and lengths.

On a GPU it measures torch.cuda.max_memory_allocated with the bfloat16 engine's autocast; on a CPU
the peak resident set (float32, no autocast), each point in a fresh process.

  PYTHONPATH=src python benchmarks/memory_plan.py [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch

GRID = [(2, 256), (8, 256), (8, 512)]  # (micro-batch, tokens per sequence)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def growth_bytes(step) -> int:
    """What running `step()` adds at its peak: CUDA's allocator on a GPU, the process's peak RSS over its RSS before
    here (run each point in a fresh process: the RSS peak is the process's). Also benchmarks/init_draft_memory.py's."""
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss()
    step()
    peak = torch.cuda.max_memory_allocated() if gpu else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak - base


def one(model: str, micro: int, T: int) -> dict:
    """Predicted and measured growth of one update of `micro` sequences of T tokens (half prompt)."""
    from transformers import AutoConfig

    from spectool.memory import GIB, train_rl_plan
    from spectool.models import resolve_model
    from spectool.rl.policy import PolicyTrainer, Rollout

    path = resolve_model(model).path
    gpu = torch.cuda.is_available()
    trainer = PolicyTrainer(path, 1e-6, 1.0, 0.2, 0.2, 0.0, micro, 1.0, engine_dtype="bfloat16" if gpu else "float32")
    g = torch.Generator().manual_seed(0)
    V = trainer.unwrapped.config.vocab_size
    rolls = [Rollout(torch.randint(0, V, (T // 2,), generator=g).tolist(),
                     torch.randint(0, V, (T - T // 2,), generator=g).tolist(), [-1.0] * (T - T // 2), 1.0, 1.0 - 2 * (i % 2))
             for i in range(micro)]
    grown = growth_bytes(lambda: trainer.update(rolls))
    plan = train_rl_plan(AutoConfig.from_pretrained(path), engine_share=0.0, total_bytes=80 * GIB,
                         micro_tokens=micro * T, kl_beta=0.0, autocast_bf16=gpu)
    rows = dict(plan.rows)
    predicted = plan.used_gib - rows["policy weights (float32)"]  # the weights are in the baseline
    act = next(v for k, v in rows.items() if k.startswith("activations"))
    return {"micro": micro, "T": T, "device": "cuda" if gpu else "cpu", "predicted_gib": predicted,
            "predicted_activations_gib": act, "measured_gib": grown / GIB}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--one", nargs=2, type=int, metavar=("MICRO", "T"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.model, *a.one)))
        return
    print(f"{'micro':>5} {'T':>5} {'device':>6} {'plan GiB':>9} {'(activ.)':>9} {'measured':>9} {'measured/plan':>14}")
    for micro, T in GRID:
        out = subprocess.run([sys.executable, __file__, "--model", a.model, "--one", str(micro), str(T)],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{micro:>5} {T:>5} {r['device']:>6} {r['predicted_gib']:>9.2f} {r['predicted_activations_gib']:>9.2f} "
              f"{r['measured_gib']:>9.2f} {r['measured_gib'] / r['predicted_gib']:>14.2f}")


if __name__ == "__main__":
    main()
