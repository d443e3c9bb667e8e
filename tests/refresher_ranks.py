"""The refresher's cross-rank path with no engine, run by tests/test_trl_ranks.py under torchrun with 2
processes (gloo): each rank captures features of its own sequences from its own training forward,
both refresh, and the draft must come out the same on both; a rank whose draft differs, and a failure
on one rank, must stop every rank. Writes OUT/rank{r}.json.

    python -m torch.distributed.run --nproc_per_node 2 refresher_ranks.py OUT POLICY DRAFT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from spectool import RefreshSettings, ranks
from spectool.draft.refresh import DraftRefresher
from spectool.errors import SpectoolError


def caught(fn) -> str | None:
    try:
        fn()
    except SpectoolError as e:
        return str(e)
    return None


def main(out: str, policy_path: str, draft: str) -> None:
    dist.init_process_group("gloo")
    r = ranks.rank()
    policy = AutoModelForCausalLM.from_pretrained(policy_path).train()
    refresher = DraftRefresher.from_folder(draft, policy, RefreshSettings(every=1, steps_per_refresh=3, lr=3e-3,
                                                                          warmup_steps=0, batch_size=4))
    start = refresher.check_one_draft(when="at the start")
    g = torch.Generator().manual_seed(100 + r)  # each rank its own rollouts
    ids = torch.randint(3, policy.config.vocab_size, (4, 24), generator=g)
    with refresher.capture([8] * 4):
        policy(input_ids=ids).logits.sum().backward()  # the trainer's own training forward
    features = ranks.digest({str(i): f.ids for i, f in enumerate(refresher.online.buffer)})
    rep = refresher.refresh(3)
    after = refresher.check_one_draft(when="after the refresh")

    # a rank that trained alone: its draft differs, and every rank stops
    if r == 1:
        with torch.no_grad():
            next(p for p in refresher.draft.parameters() if p.requires_grad).add_(1e-3)
    differ = caught(lambda: refresher.check_one_draft(when="after the refresh"))
    one_failed = caught(lambda: ranks.raise_on_any("its engine lost the draft" if r == 1 else None))
    record = {"start": start, "after": after, "features": features, "loss": rep.loss, "steps": rep.steps,
              "differ": differ, "one_failed": one_failed, "stats": ranks.stats({"x": float(r)})["x"],
              "total": ranks.total([r + 1, 10])}
    Path(out, f"rank{r}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
