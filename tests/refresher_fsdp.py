"""The refresher beside a policy sharded with FSDP2 (`fully_shard` over gloo) or DeepSpeed ZeRO-3
(its CPU accelerator), run by tests/test_sharded.py under torchrun, and the same script in one
process with the policy whole as the reference. Every rank trains on the same sequences, so the ranks' averaged gradients are one
process's: the refreshed draft must equal the one-process draft. A refresher that read its rank's
local piece of the lm_head ([V/2, H]) or the embedding could not. Then the dead-drafter check's
gather (a collective reached by every rank even when only one suspects), a checkpoint written by
the main process and restored on every rank. Writes OUT/rank{r}.json and OUT/draft.safetensors.

    python -m torch.distributed.run --nproc_per_node 2 refresher_fsdp.py OUT POLICY DRAFT fsdp LR
    python -m torch.distributed.run --nproc_per_node 2 refresher_fsdp.py OUT POLICY DRAFT zero3 LR
    python -m torch.distributed.run --nproc_per_node 1 refresher_fsdp.py OUT POLICY DRAFT plain LR

LR: the policy's own SGD step between refreshes (DeepSpeed's engine updates the policy differently
from plain SGD, so ZeRO-3 is held against the reference with LR 0: the refresher alone compared).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from spectool import RefreshSettings, ranks
from spectool.draft.refresh import DraftRefresher
from spectool.policy_weights import is_sharded
from spectool.stats import AcceptanceStats


def shard(policy):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ranks.world(),))
    for layer in policy.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    return policy


def zero3(policy, lr: float):
    import deepspeed

    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3},
           "zero_allow_untested_optimizer": True}  # the reference's plain SGD
    engine, *_ = deepspeed.initialize(model=policy, optimizer=torch.optim.SGD(policy.parameters(), lr=lr), config=cfg)
    engine.train()
    return engine


def moments(refresher) -> str:
    st = refresher.online.opt.state_dict()["state"]
    return ranks.digest({f"{i}.{k}": v for i, s in st.items() for k, v in s.items() if torch.is_tensor(v)})


def main(out: str, policy_path: str, draft: str, mode: str, policy_lr: str) -> None:
    lr = float(policy_lr)
    dist.init_process_group("gloo")
    r = ranks.rank()
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(policy_path).train()
    trainer = policy
    if mode == "fsdp":
        shard(policy)
    if mode == "zero3":
        trainer = zero3(policy, lr)  # the DeepSpeed engine; the refresher unwraps it
        policy = trainer.module
    head = policy.get_output_embeddings().weight
    settings = RefreshSettings(every=1, steps_per_refresh=3, lr=3e-3, warmup_steps=0, batch_size=4)
    refresher = DraftRefresher.from_folder(draft, trainer, settings)
    g = torch.Generator().manual_seed(100)  # the same sequences on every rank: the reference is one process
    ids = torch.randint(3, policy.config.vocab_size, (4, 24), generator=g)
    opt = None if mode == "zero3" else torch.optim.SGD(policy.parameters(), lr=lr)
    history = []
    for _ in range(2):  # two trainer steps, a refresh after each
        with refresher.capture([8] * 4):
            loss = trainer(input_ids=ids).logits.float().logsumexp(-1).mean()  # the trainer's training forward
        if opt is None:
            trainer.backward(loss)
            trainer.step()
        else:
            loss.backward()
            opt.step()
            opt.zero_grad()
        rep = refresher.refresh(3)
        history.append({"loss": rep.loss, "top1": rep.top1_after, "digest": refresher.check_one_draft(when="now"),
                        "moments": moments(refresher)})
    # the dead-drafter check: only rank 0's engine "accepted nothing"; every rank must reach the gather
    refresher._pushed_at = 0
    stats = AcceptanceStats(num_drafts=3 if r == 0 else 0, num_draft_tokens=6 if r == 0 else 0, num_accepted_tokens=0,
                            accepted_per_pos=[0, 0])
    refresher.check_acceptance(stats)
    # a checkpoint written by the main process, restored on every rank
    ckpt = Path(out, "ckpt")
    if r == 0:
        refresher.checkpoint(ckpt, {"step": 2})
    ranks.barrier()
    own = lambda: {k: v for k, v in refresher.draft.state_dict().items() if not k.startswith("embed_tokens.")}  # noqa: E731
    saved = {k: v.detach().clone() for k, v in own().items()}
    with torch.no_grad():
        for p in refresher.draft.parameters():
            p.add_(1.0)
    state = refresher.restore(ckpt)
    restored = all(torch.equal(saved[k], v) for k, v in own().items())
    record = {"mode": mode, "world": ranks.world(), "sharded": is_sharded(policy),
              "local_head": list(head.to_local().shape) if hasattr(head, "to_local") else list(head.data.shape),
              "history": history, "restored": restored, "state": state}
    Path(out, f"rank{r}.json").write_text(json.dumps(record))
    if r == 0:
        save_file({k: v.detach().contiguous() for k, v in refresher.draft.state_dict().items()
                   if not k.startswith("embed_tokens.")}, str(Path(out, "draft.safetensors")))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:6])
