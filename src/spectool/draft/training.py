"""`DraftTrainer`: a draft (EAGLE-3 or MTP layers) under accelerate with AdamW and a linear
warm-up then cosine schedule, resumable at any checkpointed step (weights, optimizer, schedule,
step; the batch order is seeded per epoch, so a resumed run draws what an uninterrupted one would).
init-draft's loop drives it; the step's loss is draft/ttt.ttt_step_loss, as in the online refresh."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from spectool.runs import atomic_torch_save


class DraftTrainer:
    """The draft under accelerate with its AdamW + warm-up/cosine schedule, resumable at any
    checkpointed step (weights, optimizer, schedule, step; batch order is seeded per epoch)."""

    def __init__(self, acc, draft, n_train: int, state_dir: Path, *, batch_size: int, epochs: int, lr: float,
                 warmup_steps: int, seed: int, max_steps: int | None = None):
        """`acc`: an accelerate Accelerator; `draft`: an Eagle3Draft or MtpDraft; `n_train`: training records;
        `max_steps`: stop there if the epochs run longer (the schedule spans the steps that run)."""
        self.acc, self.batch_size, self.seed = acc, batch_size, seed
        self.steps_per_epoch = math.ceil(n_train / batch_size)
        self.total = total = min(self.steps_per_epoch * epochs, max_steps or math.inf)
        self._order: tuple[int, list[int]] | None = None  # (epoch, its record order)
        opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
        self.draft, self.opt = acc.prepare(draft, opt)
        self.ckpt = state_dir / "checkpoint.pt"
        self.step = 0
        if self.ckpt.exists():
            st = torch.load(self.ckpt, weights_only=False)
            self.unwrapped.load_state_dict(st["draft"])
            self.opt.load_state_dict(st["opt"])
            self.sched.load_state_dict(st["sched"])
            self.step = st["step"]

    @property
    def unwrapped(self):
        return self.acc.unwrap_model(self.draft)

    def batch(self, order: Callable[[int, int], list[int]]) -> tuple[int, list[int]]:
        """(epoch, record indices of this process's share of the current step's batch); `order(seed, epoch)`: the
        epoch's records in the order they are drawn (features.epoch_order), computed once an epoch."""
        epoch, pos = divmod(self.step, self.steps_per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, order(self.seed, epoch))
        idx = self._order[1][pos * self.batch_size : (pos + 1) * self.batch_size]  # a list or an array
        share = idx[self.acc.process_index :: self.acc.num_processes]
        return epoch, [int(i) for i in (share if len(share) else idx[:1])]

    def backward(self, loss: torch.Tensor) -> None:
        """One micro-batch's share of the step's gradient (accumulated until `finish`)."""
        self.acc.backward(loss)

    def finish(self) -> None:
        """The optimizer step over the accumulated gradient; the next step starts from zero."""
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad()
        self.step += 1

    def save(self) -> None:
        if self.acc.is_main_process:
            atomic_torch_save({"draft": self.unwrapped.state_dict(), "opt": self.opt.state_dict(),
                               "sched": self.sched.state_dict(), "step": self.step}, self.ckpt)
