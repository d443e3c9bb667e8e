"""The training-time-test loss and its metrics, on draft-vocabulary distributions.

For unroll step j (0-based) at anchor t the draft predicts x[t+j+2]; its target is the policy's
next-token distribution at position t+j+1, restricted to the draft vocabulary and renormalised
(soft cross-entropy = forward KL up to the target's entropy). Steps are weighted decay**j
(EAGLE-3 / SpecForge use 0.8), or by what verification measures there (`POSITION_WEIGHTS`: ttt_loss).
Only positions whose target predicts a response token count.

Losses per position (`LOSSES`): "ce" soft cross-entropy; "tv" total variation 1 - sum_v min(p_v, q_v),
one minus the probability that a draft sampling from q is accepted (what T=1 speculation pays for);
"mix" their sum (TV's gradient vanishes where q has no mass, CE's does not); "tv-heavy" 0.1 CE + 0.9 TV, the
field's T=1 recipe (DSpark). The weights: constants.LOSS_WEIGHTS.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from spectool.constants import DEFAULT_POSITION_WEIGHTS, LOSS_WEIGHTS, LOSSES, POSITION_WEIGHTS


def step_mask(prompt_lens: torch.Tensor, lengths: torch.Tensor, T: int, j: int,
              anchors: torch.Tensor | None = None) -> torch.Tensor:
    """[B, n] bool: anchors t (0..T-1, or the given `anchors` [n]) whose step-j target position t+j+1
    lies in [prompt_len-1, length-1]. prompt_lens, lengths: [B] per row, or [B, T] per position (a packed
    row: the prompt end and the end of each position's record, as indices of the row; ttt.collate_packed)."""
    at = torch.arange(T) if anchors is None else anchors.cpu()
    lo, hi = (prompt_lens[:, at], lengths[:, at]) if prompt_lens.dim() == 2 else (prompt_lens[:, None], lengths[:, None])
    pos = at[None, :] + j + 1
    return (pos >= lo - 1) & (pos <= hi - 1)


def step_targets(x: torch.Tensor, j: int, anchors: torch.Tensor | None) -> torch.Tensor:
    """x [B, T, ...] at each anchor's step-j target position t+j+1: [B, n, ...] (`shift` when every
    anchor runs; past the end, where step_mask is False, clamped)."""
    if anchors is None:
        return shift(x, j + 1)
    return x[:, (anchors + j + 1).clamp(max=x.shape[1] - 1)]


def shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, t] -> x[:, t+n] along dim 1, zero-padded at the end."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, :n])
    return torch.cat([x[:, n:], pad], dim=1)




def position_losses(p: torch.Tensor, draft_logits: torch.Tensor, kind: str = "ce") -> torch.Tensor:
    """p: [N, Vd] target distribution, draft_logits: [N, Vd] -> [N] the loss at each position."""
    if kind not in LOSSES:
        raise ValueError(f"unknown loss {kind!r}; one of {LOSSES}")
    w_ce, w_tv = LOSS_WEIGHTS[kind]
    logq = F.log_softmax(draft_logits.float(), -1)
    loss = draft_logits.new_zeros(draft_logits.shape[:1], dtype=torch.float32)
    if w_ce:
        loss = loss + w_ce * -(p * logq).sum(-1)
    if w_tv:
        loss = loss + w_tv * (1 - torch.minimum(p, logq.exp()).sum(-1))
    return loss


def position_loss(p: torch.Tensor, draft_logits: torch.Tensor, kind: str = "ce") -> torch.Tensor:
    """The mean of `position_losses` over the N positions."""
    return position_losses(p, draft_logits, kind).mean()


def step_losses(logits: torch.Tensor, target_logits_dv: torch.Tensor, j: int, anchors: torch.Tensor | None,
                m: torch.Tensor, temperature: float, kind: str) -> torch.Tensor:
    """`position_losses` of unroll step j at the anchors m ([B, n] bool) of logits [B, n, Vd], against the policy's
    distribution at each anchor's step-j target (target_logits_dv [B, T, Vd] at `temperature`): [N]."""
    p = torch.softmax(step_targets(target_logits_dv, j, anchors)[m].float() / temperature, -1)  # [N, Vd]
    return position_losses(p, logits[m], kind)


def ttt_loss(
    draft_logits: list[torch.Tensor],  # steps x [B, n, Vd] at anchors 0..T-1 (n = T) or at `anchors`
    target_logits_dv: torch.Tensor,  # [B, T, Vd] policy logits at each position, draft vocab only
    prompt_lens: torch.Tensor,  # [B]
    lengths: torch.Tensor,  # [B] prompt + response length
    decay: float = 0.8,
    kind: str = "ce",
    temperature: float = 1.0,
    anchors: torch.Tensor | None = None,  # [n] the anchors the logits were run at (ttt.sample_anchors)
    weights: str = DEFAULT_POSITION_WEIGHTS,
    recompute: bool = False,  # each step's losses recomputed in the backward (init-draft --recompute-loss)
) -> tuple[torch.Tensor, list[float]]:
    """Weighted loss (`position_losses`) over unroll steps against the policy at `temperature`.
    `weights` (constants.POSITION_WEIGHTS) weighs the positions of step j, from a = sum_v min(p_v, q_v), the
    probability that a draft sampling from q is accepted there (detached: a weight, not a loss term):
      decay      decay**j, every position alike;
      rejection  decay**j * (1 - a), renormalised to the step's mean: the positions verification rejects;
      reach      the product of the anchor's a at steps < j: the probability that verification reaches step j
                 (an earlier step in the prompt counts as accepted), in place of decay**j.
    Returns (loss, per-step mean losses, unweighted, so arms with other weights compare)."""
    if weights not in POSITION_WEIGHTS:
        raise ValueError(f"unknown position weights {weights!r}; one of {POSITION_WEIGHTS}")
    B, T, _ = target_logits_dv.shape
    total = draft_logits[0].new_zeros(())
    reach = torch.ones(draft_logits[0].shape[:2], device=draft_logits[0].device)  # [B, n]
    per_step = []
    for j, logits in enumerate(draft_logits):
        m = step_mask(prompt_lens, lengths, T, j, anchors).to(logits.device)  # [B, n]
        if not m.any():
            per_step.append(float("nan"))
            continue
        args = (logits, target_logits_dv, j, anchors, m, temperature, kind)
        # recompute: autograd keeps no [N, Vd] copy of this step (the masked logits, log-softmax, target
        # distribution), only the step's logits, which the caller holds anyway; they are recomputed in the backward
        recompute_here = recompute and logits.requires_grad
        losses = checkpoint(step_losses, *args, use_reentrant=False) if recompute_here else step_losses(*args)
        if weights == "decay":
            total = total + (decay**j) * losses.mean()
        else:
            with torch.no_grad():
                accept = 1 - step_losses(logits, target_logits_dv, j, anchors, m, temperature, "tv")  # [N] sum min(p, q)
            if weights == "rejection":
                reject = 1 - accept
                total = total + (decay**j) * (reject * losses).sum() / reject.sum().clamp_min(1e-6)
            else:
                total = total + (reach[m] * losses).mean()
                reach[m] = reach[m] * accept
        per_step.append(float(losses.detach().mean()))
    return total, per_step


@torch.no_grad()
def acceptance_metrics(
    draft_logits: list[torch.Tensor],  # steps x [B, T, Vd]
    target_logits_full: torch.Tensor,  # [B, T, V] full-vocab policy logits
    draft_ids: torch.Tensor,  # [Vd] target id of each draft id
    prompt_lens: torch.Tensor,
    lengths: torch.Tensor,
) -> dict[str, list[float]]:
    """Per-step training proxies (not the engine's AcceptanceStats):

    top1      fraction where the draft's greedy token equals the policy's greedy token
              (greedy acceptance of that position given an accepted prefix);
    p_accept  mean policy probability of the draft's greedy token = acceptance probability at
              temperature 1 for a greedy draft (min(1, p/q) with one-hot q);
    p_accept_sampled  mean of sum_v min(p_v, q_v) = acceptance probability at temperature 1 for
              a draft that samples its proposal from q (vLLM's draft_sample_method="probabilistic");
    oracle_greedy  mean max_v p_v: p_accept of the oracle that proposes the policy's own argmax,
              the ceiling of any greedy draft at temperature 1 (a sampling draft's ceiling is 1,
              at q = p; at temperature 0 the oracle's top1 is 1).
    """
    B, T, _ = target_logits_full.shape
    # the policy's distribution, once per position (no [B, T, V] copy per step): its argmax, its top
    # probability and its probabilities on the draft vocabulary
    lse = torch.logsumexp(target_logits_full.float(), -1)  # [B, T]
    top_logit, best = target_logits_full.max(-1)  # [B, T]
    p_max = (top_logit.float() - lse).exp()  # [B, T]
    p_dv = (target_logits_full[..., draft_ids].float() - lse[..., None]).exp()  # [B, T, Vd]
    top1, p_acc, p_samp, oracle, counts = [], [], [], [], []
    for j, logits in enumerate(draft_logits):
        m = step_mask(prompt_lens, lengths, T, j)
        if not m.any():
            for out in (top1, p_acc, p_samp, oracle):
                out.append(float("nan"))
            counts.append(0)
            continue
        b, t = (i.to(best.device) for i in m.nonzero(as_tuple=True))  # [N] each, in logits[m]'s order
        pos = t + j + 1  # the policy's position each draft step is judged at
        guess = logits[m].argmax(-1)  # [N] draft ids
        top1.append(float((draft_ids[guess] == best[b, pos]).float().mean()))
        p = p_dv[b, pos]  # [N, Vd]
        p_acc.append(float(p.gather(-1, guess[:, None]).mean()))
        q = torch.softmax(logits[m].float(), -1)  # [N, Vd]; zero outside the draft vocabulary
        p_samp.append(float(torch.minimum(p, q).sum(-1).mean()))
        oracle.append(float(p_max[b, pos].mean()))
        counts.append(int(m.sum()))
    return {"top1": top1, "p_accept": p_acc, "p_accept_sampled": p_samp, "oracle_greedy": oracle, "count": counts}


@torch.no_grad()
def greedy_walk(
    draft_logits: list[torch.Tensor],  # steps x [B, T, Vd], anchors 0..T-1
    target_logits_full: torch.Tensor,  # [B, T, V] the policy's logits at the same positions
    draft_ids: torch.Tensor,  # [Vd] target id of each draft id
    ids: torch.Tensor,  # [B, T] the records' tokens at the same positions
    prompt_lens: torch.Tensor,  # [B]
    lengths: torch.Tensor,  # [B]
) -> dict[str, dict[str, list[int]]]:
    """Verify steps and accepted tokens per k = 1..steps, for the draft's greedy proposals and the
    oracle's (the policy's own argmax), walked over the records as the engine drafts them.

    Exact for greedy proposals on paths the policy sampled, at their temperature: vLLM accepts a
    one-hot proposal d with probability p(d) and otherwise resamples from p with d removed, so the
    emitted token equals d exactly when d is accepted, and the engine's output is distributed as
    the policy's samples. Hence on a record: the first draft step anchors at the last prompt
    position; at anchor t the chain proposes x[t+2..t+k+1] (each step fed the record's token,
    which is its own accepted proposal), m = its leading matches with the record are accepted and
    the next anchor is t + m + 1. Unlike per-position averages (`acceptance_metrics`), this weights
    positions as the engine visits them: an anchor lands right after a rejection more often.
    """
    guesses = {"draft": [draft_ids[lg.argmax(-1)] for lg in draft_logits],  # steps x [B, T]
               "oracle": [shift(target_logits_full.argmax(-1), j + 1) for j in range(len(draft_logits))]}
    out = {}
    for name, g in guesses.items():
        match = torch.stack([g[j] == shift(ids, j + 2) for j in range(len(g))], -1).tolist()  # [B, T, steps]
        steps, accepted = [0] * len(g), [0] * len(g)
        for k in range(1, len(g) + 1):
            for b, (p, n) in enumerate(zip(prompt_lens.tolist(), lengths.tolist())):
                t = p - 1
                while t + 2 <= n - 1:
                    m = 0
                    while m < k and t + m + 2 <= n - 1 and match[b][t][m]:
                        m += 1
                    steps[k - 1] += 1
                    accepted[k - 1] += m
                    t += m + 1
        out[name] = {"steps": steps, "accepted": accepted}
    return out
