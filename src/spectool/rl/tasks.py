"""The prompts of each train-rl step: a fixed pool drawn from the data source's train split,
walked in a seeded order per epoch, so step n's prompts are a function of n (a resumed run
draws exactly what an uninterrupted one would)."""

from __future__ import annotations

import torch

from spectool.prompts import encode_tasks
from spectool.rl.config import RLConfig


class StepPrompts:
    """Prompts of step n: a fixed pool, walked in a seeded order per epoch (a function of n)."""

    def __init__(self, source, tokenizer, cfg: RLConfig):
        want = min(cfg.policy.steps * cfg.rollout.prompts_per_step, 4096)
        self.tasks = source.tasks("train", want)
        self.ids = encode_tasks(tokenizer, self.tasks, cfg.rollout)  # as rl.yaml's rollout section renders them
        self.P, self.seed = cfg.rollout.prompts_per_step, cfg.seed

    def for_step(self, step: int) -> list[int]:
        per_epoch = max(len(self.tasks) // self.P, 1)
        epoch, pos = divmod(step, per_epoch)
        order = torch.randperm(len(self.tasks), generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))
        return order[pos * self.P : (pos + 1) * self.P].tolist() or order[: self.P].tolist()
