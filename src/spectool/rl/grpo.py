"""GRPO's advantage and objective, as pure tensor functions (tested on hand-made numbers).

advantages: rewards of the G samples of each prompt, normalised within the group
    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)        (std optional: Dr. GRPO drops it)
objective per response token t (ratio against the behaviour policy that sampled it):
    rho_t  = exp(logp_new_t - logp_old_t)
    l_t    = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A)
           + beta * (exp(ref_t - new_t) - (ref_t - new_t) - 1)     (k3 KL estimator, optional)
aggregated as the mean over all response tokens of the batch (token-level, as DAPO does), so long
responses are not down-weighted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale_by_std: bool = True) -> torch.Tensor:
    """rewards: [P, G] (P prompts x G samples) -> advantages [P, G]; all-equal groups give 0."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not scale_by_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)


@dataclass
class LossParts:
    loss: torch.Tensor  # scalar, to backpropagate
    clip_fraction: float  # share of tokens where the clipped term was the active one
    kl: float  # mean k3 KL to the reference (0 without one)


def grpo_loss(
    logp_new: torch.Tensor,  # [B, T] policy logprobs of the sampled tokens (with grad)
    logp_old: torch.Tensor,  # [B, T] behaviour logprobs (from the engine that sampled)
    advantages: torch.Tensor,  # [B] one per response
    mask: torch.Tensor,  # [B, T] 1 on response tokens
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    logp_ref: torch.Tensor | None = None,  # [B, T] reference policy logprobs (needed when beta > 0)
) -> LossParts:
    mask = mask.to(logp_new.dtype)
    n = mask.sum().clamp(min=1)
    ratio = torch.exp(logp_new - logp_old)
    a = advantages[:, None]
    unclipped = ratio * a
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * a
    per_tok = -torch.minimum(unclipped, clipped)
    clip_frac = float(((clipped < unclipped).to(mask.dtype) * mask).sum() / n)
    kl_val = 0.0
    if beta > 0:
        if logp_ref is None:
            raise ValueError("beta > 0 needs logp_ref")
        d = logp_ref - logp_new
        kl = torch.exp(d) - d - 1
        per_tok = per_tok + beta * kl
        kl_val = float((kl.detach() * mask).sum() / n)
    return LossParts((per_tok * mask).sum() / n, clip_frac, kl_val)
