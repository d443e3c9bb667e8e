"""Online draft refresh for train-rl: the EAGLE-3 draft keeps learning from the policy it serves.

The trainer hands over features it already computed in its own training forward (detached: no
gradient reaches the policy), the draft keeps them in a bounded buffer, and every N policy steps
it trains on them with its own optimizer, learning rate and warm-up, unrolled over all `ttt_steps`
draft positions (NeMo RL trains only position 1 online). Under a data-parallel launcher every rank
holds the same draft and its own rollouts' features; the gradients are averaged over the ranks at
every step (ranks.py), so the draft stays one. The targets are the policy's next-token
distributions, lm_head(last hidden state), read with the policy's current lm_head; the draft's
token embedding follows the policy's, as it does inside vLLM (the draft shares the policy's).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from spectool import ranks
from spectool.constants import MAX_BATCH_TOKENS
from spectool.draft.checkpoint import save_draft
from spectool.draft.model import Eagle3Draft
from spectool.draft.mtp import MtpDraft
from spectool.draft.mtp_folder import attach_mtp
from spectool.draft.ttt import heldout_metrics, micro_batches, ttt_step_loss
from spectool.draft.vocab import ids_from_d2t
from spectool.policy_weights import embeddings


@dataclass
class Features:
    """One sequence's features from the policy's forward (stored half-size: hidden.to_store)."""

    ids: torch.Tensor  # [T] prompt + response token ids
    aux: torch.Tensor  # [T, n_aux * H] aux hidden states, vLLM's layer convention
    last: torch.Tensor  # [T, H] final-norm output (logits = lm_head(last))
    prompt_len: int


@dataclass
class RefreshReport:
    steps: int  # draft optimizer steps so far, over the whole run
    loss: float  # mean TTT loss of this refresh
    top1_before: list[float]  # per draft position, on the newest features, before training
    top1_after: list[float]
    sequences: int  # buffer size used
    p_accept_after: list[float]  # per draft position: P(accept) of the greedy draft at T=1, after training
    train_s: float = 0.0  # seconds in the draft optimizer steps
    measure_s: float = 0.0  # seconds measuring agreement on the newest features, before and after


class OnlineDraft:
    def __init__(self, draft: Eagle3Draft, lr: float, warmup_steps: int, ttt_steps: int, batch_size: int,
                 buffer_size: int, loss: str = "mix", step_decay: float = 0.8, seed: int = 0,
                 device: str | torch.device = "cpu", max_batch_tokens: int = MAX_BATCH_TOKENS):
        self.device = torch.device(device)
        self.draft = draft.to(self.device).train()  # trains where the policy lives; the buffer stays on the host
        self.ttt_steps = ttt_steps
        self.loss = loss  # loss.LOSSES, as init-draft's --loss
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens  # a step's micro-batches: packed records up to this many tokens
        self.buffer: list[Features] = []
        self.buffer_size = buffer_size
        self.step_decay = step_decay
        self.steps = 0
        self.rng = random.Random(seed)
        self.target_ids = ids_from_d2t(draft.d2t).to(self.device)  # [Vd] policy id of each draft id
        if hasattr(draft, "mask_embedding"):  # DFlash: vLLM re-reads it from the folder's mask_embedding.pt at
            draft.mask_embedding.requires_grad_(False)  # every reload, so online it stays as exported
        self.params = [p for p in draft.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / max(warmup_steps, 1)))

    def add(self, feats: list[Features]) -> None:
        """Newest last; the oldest go once the buffer is full."""
        self.buffer.extend(feats)
        del self.buffer[: max(0, len(self.buffer) - self.buffer_size)]

    def refresh(self, policy, n_steps: int, before: list[float] | None = None) -> RefreshReport:
        """Train `n_steps` TTT steps on mini-batches drawn from the buffer. `before`: the draft's per-position
        agreement on the newest features, when the caller has just measured it (else measured here)."""
        emb, W = embeddings(policy)  # [V, H] each, whole (gathered under FSDP2: every rank refreshes together)
        if W.device != self.device:  # the draft trains where the policy lives (parameters keep their identity)
            self.device = W.device
            self.draft.to(self.device)
            self.target_ids = self.target_ids.to(self.device)
        self.draft.follow(emb, W)  # the policy's current embedding (and, for MTP layers, lm_head), as in vLLM
        W_dv = W[self.target_ids]  # [Vd, H]
        newest = self.buffer[-self.batch_size :]
        t0 = time.perf_counter()
        before = before if before is not None else self.metrics(newest, W)["top1"]
        t1 = time.perf_counter()
        losses = []
        for _ in range(n_steps):
            batch = self.rng.sample(self.buffer, min(self.batch_size, len(self.buffer)))
            self.opt.zero_grad()
            loss = self._step_gradients(batch, W_dv)
            ranks.average_grads(self.params)  # data-parallel ranks: one draft, trained on every rank's rollouts
            self.opt.step()
            self.sched.step()
            self.steps += 1
            losses.append(loss)
        t2 = time.perf_counter()
        after = self.metrics(newest, W)
        return RefreshReport(self.steps, sum(losses) / len(losses), before, after["top1"], len(self.buffer),
                             after["p_accept"], train_s=t2 - t1, measure_s=(t1 - t0) + (time.perf_counter() - t2))

    def _step_gradients(self, batch: list[Features], W_dv: torch.Tensor) -> float:
        """One step's loss, its gradients accumulated over micro-batches of at most max_batch_tokens packed tokens
        (ttt.micro_batches: no padding, memory linear in the tokens of one micro-batch, whatever the batch's
        records' lengths; a batch within the budget is one forward, the padded whole batch's gradient; split, the
        micro-batches are weighted by their response tokens, within a few percent of it: tests/test_refresh.py).
        W_dv: [Vd, H]."""
        total = 0.0
        for idx, share in micro_batches([len(f.ids) for f in batch], [f.prompt_len for f in batch],
                                        self.max_batch_tokens):
            part = [batch[i] for i in idx]
            loss, _ = ttt_step_loss(self.draft, [(f.ids, f.aux, f.last) for f in part], [f.prompt_len for f in part],
                                    W_dv, self.ttt_steps, self.step_decay, self.device, self.loss, pack=True)
            (loss * share).backward()
            total += share * float(loss.detach())
        return total

    def metrics(self, feats: list[Features], W: torch.Tensor, counts: bool = False) -> dict[str, list[float]]:
        """Per draft position: greedy agreement with the policy (top1) and P(accept) at T=1 (`counts`: and the
        positions scored)."""
        return heldout_metrics(self.draft, [(f.ids, f.aux, f.last) for f in feats], [f.prompt_len for f in feats], W,
                               self.target_ids, self.ttt_steps, len(feats), self.device, walk=False, counts=counts)

    def state_dict(self) -> dict:
        return {"opt": self.opt.state_dict(), "sched": self.sched.state_dict(), "steps": self.steps,
                "rng": self.rng.getstate()}

    def load_state_dict(self, st: dict) -> None:
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        self.steps = st["steps"]
        self.rng.setstate(st["rng"])

    def save(self, folder: Path, extra: dict) -> None:
        """A vLLM-loadable draft folder; MTP layers go into `folder` as a saved policy's (attach_mtp)."""

        if isinstance(self.draft, MtpDraft):
            attach_mtp(folder, self.draft, extra)
            return

        save_draft(self.draft, folder, extra=extra)
