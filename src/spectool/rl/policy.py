"""The policy side of train-rl: a transformers causal LM trained with GRPO under accelerate.

One training forward per step does two jobs: the GRPO loss (with gradient) and the trainer's
logprobs of the sampled tokens (compared with the engine's behaviour logprobs). When the draft is
refreshed online, a `DraftRefresher`'s hooks capture its features during that same forward, as
they would in any other trainer (`update(..., capture=refresher.capture)`).
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from spectool.engine.probe import torch_dtype
from spectool.errors import SpectoolError
from spectool.policy_weights import checkpoint_layout
from spectool.precision import logprob_gaps, trainer_autocast
from spectool.rl.grpo import grpo_loss


@dataclass
class Rollout:
    """One sampled completion with what the engine said about it."""

    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]  # the engine's logprob of each sampled token (processed: at the temperature)
    reward: float
    advantage: float = 0.0


@dataclass
class UpdateReport:
    loss: float
    clip_fraction: float
    kl: float
    grad_norm: float
    behaviour_gap: float  # mean |trainer - engine| logprob of the sampled tokens, before the update
    tokens: int


class PolicyTrainer:
    def __init__(self, model_path: str, lr: float, temperature: float, eps_low: float, eps_high: float,
                 kl_beta: float, micro_batch_size: int, max_grad_norm: float, seed: int = 0,
                 engine_dtype: str = "float32"):
        from accelerate import Accelerator  # noqa: PLC0415 (heavy, loaded only on this path)
        from transformers import AutoModelForCausalLM  # noqa: PLC0415 (heavy, loaded only on this path)

        torch.manual_seed(seed)
        self.acc = Accelerator(cpu=not torch.cuda.is_available())
        if self.acc.num_processes > 1:
            raise SpectoolError("train-rl trains the policy in one process (vLLM holds the rollout engine in this "
                                "one); scale the engine with vLLM tensor parallelism instead of accelerate processes")
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.config.use_cache = False
        self.ref = copy.deepcopy(model).eval().requires_grad_(False) if kl_beta > 0 else None
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        self.model, self.opt = self.acc.prepare(model, opt)
        if self.ref is not None:  # frozen: no optimizer, no wrapping; only placed next to the policy
            self.ref.to(self.acc.device)
        self.model.train()
        self.temperature = temperature
        self.eps_low, self.eps_high, self.kl_beta = eps_low, eps_high, kl_beta
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = max_grad_norm
        self.engine_dtype = engine_dtype  # bfloat16: the forward runs at it; float16: float32 (precision.trainer_dtype)

    @property
    def unwrapped(self):
        return self.acc.unwrap_model(self.model)

    def engine_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights to send to the rollout engine, in the checkpoint layout vLLM loads (a
        mixture of experts' fused experts split per expert: policy_weights.checkpoint_layout) and the
        engine's dtype (it rounds them to it anyway; a bfloat16 copy is half the bytes), a decoder
        layer at a time: a consumer that streams them (colocated.send_weights) never holds the whole
        model twice."""

        dt = torch_dtype(self.engine_dtype)
        model = self.unwrapped
        yield from checkpoint_layout(model, ((k, v.detach().to(dt)) for k, v in model.state_dict().items()))

    def _token_logprobs(self, model, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """ids, attn: [B, T] -> logprobs of ids[:, 1:] at the sampling temperature [B, T-1]."""

        with trainer_autocast(self.engine_dtype, ids.device):
            out = model(input_ids=ids, attention_mask=attn)
        logp = torch.log_softmax(out.logits[:, :-1].float() / self.temperature, -1)
        return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)

    def update(self, rollouts: list[Rollout], capture: Callable[[list[int]], contextlib.AbstractContextManager] | None = None
               ) -> UpdateReport:
        """One GRPO step on `rollouts` (gradient accumulation over micro-batches; token-level mean).
        `capture(prompt_lens)`: a context around each training forward (DraftRefresher.capture)."""
        dev = self.acc.device
        n_tokens = sum(len(r.response_ids) for r in rollouts)
        self.opt.zero_grad()
        loss_sum = clip_sum = kl_sum = gap_sum = 0.0
        for b in range(0, len(rollouts), self.micro_batch_size):
            mb = rollouts[b : b + self.micro_batch_size]
            ids, attn, mask, old = _pack(mb, dev)  # [B, T], [B, T], [B, T-1], [B, T-1]
            ctx = capture([len(r.prompt_ids) for r in mb]) if capture else contextlib.nullcontext()
            with ctx:
                logp = self._token_logprobs(self.model, ids, attn)
            ref = None
            if self.ref is not None:
                with torch.no_grad():
                    ref = self._token_logprobs(self.ref, ids, attn)
            adv = torch.tensor([r.advantage for r in mb], dtype=torch.float32, device=dev)
            parts = grpo_loss(logp, old, adv, mask, self.eps_low, self.eps_high, self.kl_beta, ref)
            n_mb = float(mask.sum())
            self.acc.backward(parts.loss * (n_mb / n_tokens))  # token-level mean over the whole batch
            loss_sum += float(parts.loss.detach()) * n_mb
            clip_sum += parts.clip_fraction * n_mb
            kl_sum += parts.kl * n_mb
            gap_sum += float(((logp.detach() - old).abs() * mask).sum())
        grad_norm = float(self.acc.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
        self.opt.step()
        n = max(n_tokens, 1)
        return UpdateReport(loss_sum / n, clip_sum / n, kl_sum / n, grad_norm, gap_sum / n, n_tokens)

    @torch.no_grad()
    def logprobs(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """The trainer's raw (temperature 1) logprob of each response token: the engine check."""
        t = self.temperature
        self.temperature = 1.0
        try:
            rs = [Rollout(p, r, [0.0] * len(r), 0.0) for p, r in zip(prompts, responses)]
            ids, attn, mask, _ = _pack(rs, self.acc.device)
            logp = self._token_logprobs(self.model, ids, attn)
        finally:
            self.temperature = t
        return [logp[i][mask[i]].tolist() for i in range(len(rs))]

    def state_dict(self) -> dict:
        return {"opt": self.opt.state_dict(), "rng": torch.get_rng_state()}

    def load_state_dict(self, st: dict) -> None:
        self.opt.load_state_dict(st["opt"])
        torch.set_rng_state(st["rng"])


def _pack(rollouts: list[Rollout], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt + response. Returns ids, attention mask [B, T]; response-token mask and
    behaviour logprobs aligned with the next-token predictions [B, T-1] (column t predicts ids[:, t+1])."""
    T = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    B = len(rollouts)
    ids = torch.zeros(B, T, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T - 1, dtype=torch.bool)
    old = torch.zeros(B, T - 1)
    for i, r in enumerate(rollouts):
        P, R = len(r.prompt_ids), len(r.response_ids)
        ids[i, : P + R] = torch.tensor(r.prompt_ids + r.response_ids)
        attn[i, : P + R] = 1
        mask[i, P - 1 : P - 1 + R] = True
        old[i, P - 1 : P - 1 + R] = torch.tensor(r.behaviour_logprobs, dtype=torch.float32)
    return ids.to(device), attn.to(device), mask.to(device), old.to(device)


def update_within_memory(trainer: PolicyTrainer, rollouts: list[Rollout], capture, engine_share: float):
    """One policy update (PolicyTrainer.update); running out of GPU memory names the train-rl
    settings that decide it."""
    try:
        return trainer.update(rollouts, capture=capture)
    except torch.OutOfMemoryError as err:
        raise SpectoolError(
            f"the policy update ran out of GPU memory ({' '.join(str(err).split())[:200]}) although the memory plan "
            f"printed at the start fitted (its activations are an estimate). Lower policy.micro_batch_size or "
            f"rollout.max_tokens, or engine.gpu_memory_utilization (now {engine_share}) to leave the trainer more; or run "
            "`spectool train-rl --backend trl` (sharding, LoRA). The last checkpoint is intact.") from None


def check_engine_logprobs(engine, trainer: PolicyTrainer, rollouts: list[Rollout], tol: float, step: int) -> dict:
    """Engine vs trainer logprobs of a few sampled sequences, after the weight sync; a mean gap
    over `tol` (train-rl's policy.logprob_tolerance; precision.py says why the mean) stops the run:
    the engine is not running the trained weights."""

    few = rollouts[:4]
    prompts, resps = [r.prompt_ids for r in few], [r.response_ids for r in few]
    mean, worst = logprob_gaps(engine.sequence_logprobs(prompts, resps), trainer.logprobs(prompts, resps))
    if not (math.isfinite(mean) and mean <= tol):
        raise SpectoolError(
            f"step {step}: the engine's logprobs differ from the trainer's by {mean:.3g} nats on average (max {worst:.3g}; "
            f"> policy.logprob_tolerance = {tol}): the engine is not running the trained weights (stale weight sync). "
            "The last checkpoint is intact; check the engine's weight loading for this model, or raise the tolerance "
            "if the engine runs in lower precision than the trainer.")
    return {"logprob_check_mean_diff": mean, "logprob_check_max_diff": worst}
