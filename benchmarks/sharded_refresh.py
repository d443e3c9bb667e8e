"""The draft refresh beside a sharded policy, side by side in one run: seconds per refresh and peak
memory per rank for 1 process (the policy whole), 2 processes with the policy replicated (DDP's
layout: every rank holds it whole) and 2 processes with the policy sharded by FSDP2 (`fully_shard`),
each arm a fresh torchrun launch over gloo on this machine (2 cores: one thread a process). Every arm trains the policy with AdamW
(so its gradients and moments count), captures the refresher's features from that training forward
and refreshes the draft. Plumbing on a CPU, not a GPU result: it shows where the bytes go.

Printed beside the measurement: memory.trl_plan's per-rank rows for the same policy, float32, no
engine (what the plan says sharding saves against what it saved).

  .venv/bin/python benchmarks/sharded_refresh.py [--model smollm2-135m] [--draft FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = (("one process", 1, "plain"), ("2 processes, replicated", 2, "plain"), ("2 processes, FSDP2", 2, "fsdp"))
REFRESHES, STEPS = 2, 2  # refreshes timed (after one warm-up), draft steps each


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _held_bytes(policy, opt) -> int:
    """Bytes of this rank's own pieces of the policy's weights, gradients and AdamW moments (a DTensor
    counts its local shard)."""
    import torch

    def local(t) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    n = sum(local(p) + (local(p.grad) if p.grad is not None else 0) for p in policy.parameters())
    return n + sum(local(v) for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim())


def worker(out: str, model: str, draft: str, mode: str) -> None:
    """One rank: the policy (sharded or not), a training step with the refresher's capture, refreshes."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from spectool import RefreshSettings, ranks
    from spectool.draft.refresh import DraftRefresher

    dist.init_process_group("gloo")
    base = _rss()
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).train()
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (ranks.world(),))
        for layer in policy.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(policy, mesh=mesh)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    refresher = DraftRefresher.from_folder(draft, policy, RefreshSettings(every=1, steps_per_refresh=STEPS,
                                                                          warmup_steps=0, batch_size=4))
    g = torch.Generator().manual_seed(100 + ranks.rank())
    ids = torch.randint(3, policy.config.vocab_size, (4, 128), generator=g)
    with refresher.capture([32] * 4):
        policy(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    opt.step()
    held = _held_bytes(policy, opt)  # the trainer's state as this rank holds it: what the plan's rows count
    opt.zero_grad()
    trained = _rss()
    refresher.refresh(STEPS)  # warm-up
    t = time.perf_counter()
    for _ in range(REFRESHES):
        refresher.refresh(STEPS)
    seconds = (time.perf_counter() - t) / REFRESHES
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rec = {"rank": ranks.rank(), "refresh_s": seconds, "held_gib": held / 2**30, "after_step_gib": (trained - base) / 2**30,
           "peak_gib": (peak - base) / 2**30}
    Path(out, f"rank{ranks.rank()}.json").write_text(json.dumps(rec))
    dist.destroy_process_group()


def arm(model: str, draft: str, processes: int, mode: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
               str(29500 + os.getpid() % 1000), __file__, "--worker", out, model, draft, mode]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(2 // processes)})
        if r.returncode:
            sys.exit(r.stderr[-3000:])
        return [json.loads(Path(out, f"rank{i}.json").read_text()) for i in range(processes)]


def plan_rows(model: str, shards: int) -> dict[str, float]:
    from transformers import AutoConfig

    from spectool.memory import GIB, trl_plan

    plan = trl_plan(AutoConfig.from_pretrained(model), param_bytes=4, engine_share=0.0, total_bytes=80 * GIB,
                    micro_tokens=0, ref_model=False, shards=shards, trainable_fraction=1.0, checkpointing=False,
                    draft_params=1, processes=shards)
    return {k: v for k, v in plan.rows if not k.startswith(("spectool", "activations"))}


def untrained_draft(ref) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids

    policy = AutoModelForCausalLM.from_pretrained(ref.path)
    d = new_draft(policy, torch.arange(policy.config.vocab_size), default_aux_layer_ids(policy.config.num_hidden_layers))
    out = tempfile.mkdtemp(prefix="spectool-draft-")
    save_draft(d, Path(out), extra=draft_metadata(ref, 3))
    return out


def main() -> None:
    from spectool.models import resolve_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft", default=None, help="a draft folder (default: an untrained EAGLE-3 draft: the cost of a "
                    "refresh does not depend on what the draft knows)")
    a = ap.parse_args()
    ref = resolve_model(a.model)
    model = ref.path
    if a.draft is None:
        a.draft = untrained_draft(ref)
    print(f"policy {a.model}, draft {a.draft}, {REFRESHES} refreshes of {STEPS} draft steps after a warm-up\n")
    print("| arm | refresh s (per rank) | weights + gradients + AdamW held, GiB | RSS after the step, GiB | peak RSS, GiB |")
    print("|---|---|---|---|---|")
    for name, n, mode in ARMS:
        recs = arm(model, a.draft, n, mode)
        fmt = lambda k: " / ".join(f"{r[k]:.2f}" for r in recs)  # noqa: E731
        print(f"| {name} | {fmt('refresh_s')} | {fmt('held_gib')} | {fmt('after_step_gib')} | {fmt('peak_gib')} |")
    for shards in (1, 2):
        rows = plan_rows(model, shards)
        print(f"\nplan per rank, {shards} shard(s): " + ", ".join(f"{k} {v:.2f}" for k, v in rows.items())
              + f"; total {sum(rows.values()):.2f} GiB")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(*sys.argv[2:6])
    else:
        main()
