"""The training-time-test step and the held-out evaluation, shared by init-draft and the online
refresh in train-rl: one definition of how a draft is trained and measured on policy features.

A feature item is one sequence's (ids [T], aux [T, n_aux * H], last [T, H]) as the policy computed
it (hidden.py); `prompt_len` marks where its response starts.
"""

from __future__ import annotations

import math

import torch
from torch.nn.utils.rnn import pad_sequence

from spectool.constants import DEFAULT_POSITION_WEIGHTS
from spectool.draft.loss import acceptance_metrics, greedy_walk, ttt_loss

METRICS = ("top1", "p_accept", "p_accept_sampled", "oracle_greedy")  # per draft position (loss.acceptance_metrics)
WALKS = {"walk_greedy": "draft", "walk_oracle": "oracle"}  # acceptance length per k = 1..steps (loss.greedy_walk)


def collate_features(items, prompt_lens, device: torch.device | str = "cpu"):
    """Right-pad a list of (ids, aux, last) -> ids [B,T], aux [B,T,3H], last [B,T,H] float32 on
    `device`; P [B], L [B] on the host. The half-size features travel as they are stored and are
    padded and widened on the device (half the bytes over PCIe, no float32 copy on the host)."""

    def padded(ts, dtype):
        return pad_sequence([t.to(device, non_blocking=True).to(dtype) for t in ts], batch_first=True)

    ids = padded([x[0] for x in items], torch.int64)
    P, L = torch.tensor(prompt_lens), torch.tensor([len(x[0]) for x in items])
    return ids, padded([x[1] for x in items], torch.float32), padded([x[2] for x in items], torch.float32), P, L


def collate_packed(items, prompt_lens, device: torch.device | str = "cpu"):
    """Concatenate a list of (ids, aux, last) into one row, no padding: ids [1, N], aux [1, N, 3H], last [1, N, H]
    float32 on `device`; segments [R + 1] ints (each record's start in the row, then N: model.record_positions);
    P, L [1, N] on the host: for each position, its record's prompt end and end as indices of the row (step_mask's
    per-position form). The drafts' unroll restarts positions at each record and keeps records apart in attention,
    so a packed row trains as its records padded into a batch would (tests/test_draft_attention.py)."""
    lengths = torch.tensor([len(x[0]) for x in items])
    segments = [0, *torch.cumsum(lengths, 0).tolist()]
    start = torch.tensor(segments[:-1])

    def packed(ts, dtype):
        return torch.cat([t.to(device, non_blocking=True).to(dtype) for t in ts])[None]

    P = (start + torch.tensor(prompt_lens)).repeat_interleave(lengths)[None]
    L = (start + lengths).repeat_interleave(lengths)[None]
    return (packed([x[0] for x in items], torch.int64), packed([x[1] for x in items], torch.float32),
            packed([x[2] for x in items], torch.float32), segments, P, L)


def packed_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices in order of length, cut into micro-batches whose records together stay within max_tokens (a longer
    record alone); each micro-batch trains as one packed row (collate_packed)."""
    out: list[list[int]] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if out and total + lengths[i] <= max_tokens:
            out[-1].append(i)
            total += lengths[i]
        else:
            out.append([i])
            total = lengths[i]
    return out


def micro_batches(lengths: list[int], prompt_lens: list[int], max_tokens: int) -> list[tuple[list[int], float]]:
    """A step's micro-batches: (record indices, their share of the step's response tokens). The whole batch at once
    when it fits in max_tokens, else packed_batches. Weighted by its share, a mean over response tokens sums to the
    whole batch's; the TTT loss averages each unroll step over its own positions, so its split sum is within a few
    percent of the whole batch's (tests/test_refresh.py)."""
    if sum(lengths) <= max_tokens:
        return [(list(range(len(lengths))), 1.0)]
    response = [n - p for n, p in zip(lengths, prompt_lens)]
    return [(mb, sum(response[i] for i in mb) / max(sum(response), 1)) for mb in packed_batches(lengths, max_tokens)]


def first_anchor(prompt_lens: torch.Tensor, steps: int) -> int:
    """First anchor any step's loss reads (step j needs t >= P - 2 - j): earlier ones only give keys."""
    return max(0, int(prompt_lens.min()) - 1 - steps)


def sample_anchors(prompt_lens: torch.Tensor, lengths: torch.Tensor, steps: int, start: int, T: int, fraction: float,
                   generator: torch.Generator) -> torch.Tensor | None:
    """The anchors one training step runs (None: every one): a `fraction` of the anchors t >= start
    whose loss some record reads (a step-j target t+j+1 in its response), drawn without replacement,
    sorted; at least one. As speculators trains DFlash and P-EAGLE (512 sampled anchors per 2,048
    packed tokens): each step costs that fraction of the full unroll, the context keys excepted.
    Positions are absolute: [n] int64 on the host. prompt_lens, lengths: [B], or [1, T] per position (a packed row:
    collate_packed)."""
    if fraction >= 1:
        return None
    t = torch.arange(start, T)
    lo, hi = ((prompt_lens[:, t], lengths[:, t]) if prompt_lens.dim() == 2
              else (prompt_lens[:, None], lengths[:, None]))
    read = ((t[None, :] >= lo - 1 - steps) & (t[None, :] <= hi - 2)).any(0)  # [T-start]
    candidates = t[read]
    n = max(1, math.ceil(fraction * len(candidates)))
    return candidates[torch.randperm(len(candidates), generator=generator)[:n].sort().values]


def chain_length(rates: list[float]) -> float:
    """Expected tokens per verify step when position j is accepted with probability rates[j] given
    its prefix was: 1 + r1 + r1 r2 + ... (the proxies are measured on the policy's own path)."""
    return 1 + sum(math.prod(rates[: i + 1]) for i in range(len(rates)))


def ttt_step_loss(draft, items, prompt_lens: list[int], W_dv: torch.Tensor, ttt_steps: int, decay: float,
                  device, loss: str = "ce", anchor_fraction: float = 1.0,
                  generator: torch.Generator | None = None,
                  weights: str = DEFAULT_POSITION_WEIGHTS, pack: bool = False,
                  recompute: bool = False) -> tuple[torch.Tensor, list[float]]:
    """The weighted TTT loss of one batch (the caller does backward and the optimizer step).
    W_dv: [Vd, H] the policy's output embedding rows of the draft vocabulary; loss: loss.LOSSES;
    anchor_fraction < 1: the step runs that share of the anchors (`sample_anchors`, drawn by `generator`);
    weights: how each step's positions are weighted (constants.POSITION_WEIGHTS, loss.ttt_loss);
    pack: the records in one row (collate_packed) instead of padded to the longest: the same loss, no padding;
    recompute: each step's loss recomputed in the backward (loss.ttt_loss)."""
    if pack:
        ids, aux, last, segments, P, L = collate_packed(items, prompt_lens, device)
        s, seg = 0, {"segments": segments}
    else:
        ids, aux, last, P, L = collate_features(items, prompt_lens, device)
        s, seg = first_anchor(P, ttt_steps), {}
    anchors = sample_anchors(P, L, ttt_steps, s, ids.shape[1], anchor_fraction, generator or torch.Generator())
    logits = draft(aux, ids, ttt_steps, s, None if anchors is None else anchors.to(ids.device), **seg)  # steps x [B, n, Vd]
    return ttt_loss(logits, last[:, s:] @ W_dv.T, P - s, L - s, decay, kind=loss,
                    anchors=None if anchors is None else (anchors - s).to(ids.device), weights=weights,
                    recompute=recompute)


@torch.no_grad()
def heldout_metrics(draft, items, prompt_lens: list[int], W: torch.Tensor, target_ids: torch.Tensor, ttt_steps: int,
                    batch_size: int, device, walk: bool = True, counts: bool = False) -> dict[str, list[float]]:
    """METRICS per draft position over `items`, weighted by the positions each batch scores, and
    (`walk`) WALKS: the acceptance length of greedy proposals (the draft's, the oracle's) at
    k = 1..ttt_steps, exact for the engine at the records' temperature (loss.greedy_walk; a Python
    loop over every position, so callers that need only the proxies skip it).
    W: [V, H] the policy's output embedding; target_ids: [Vd] on `device`. `counts`: also the positions scored per
    draft position ("count"), to pool measurements of several calls."""
    was_training = draft.training
    draft.eval()
    sums = {k: [0.0] * ttt_steps for k in (*METRICS, "count")}
    walks = {name: {"steps": [0] * ttt_steps, "accepted": [0] * ttt_steps} for name in WALKS.values()}
    for b in range(0, len(items), batch_size):
        ids, aux, last, P, L = collate_features(items[b : b + batch_size], prompt_lens[b : b + batch_size], device)
        s = first_anchor(P, ttt_steps)
        # the targets in the policy's dtype, as its lm_head computes them (a bfloat16 W is not widened: [V, H])
        logits, target = draft.unroll(aux, ids, ttt_steps, s), last[:, s:].to(W.dtype) @ W.T  # steps x [B, T-s, Vd]; [B, T-s, V]
        m = acceptance_metrics(logits, target, target_ids, P - s, L - s)
        for k in METRICS:
            sums[k] = [acc + (0 if math.isnan(v) else v) * c for acc, v, c in zip(sums[k], m[k], m["count"])]
        sums["count"] = [a + c for a, c in zip(sums["count"], m["count"])]
        if walk:
            for name, w in greedy_walk(logits, target, target_ids, ids[:, s:], P - s, L - s).items():
                for key in ("steps", "accepted"):
                    walks[name][key] = [a + c for a, c in zip(walks[name][key], w[key])]
    draft.train(was_training)
    out = {k: [v / max(c, 1) for v, c in zip(sums[k], sums["count"])] for k in METRICS}
    if counts:
        out["count"] = sums["count"]
    if walk:
        for key, name in WALKS.items():
            out[key] = [1 + a / max(n, 1) for a, n in zip(walks[name]["accepted"], walks[name]["steps"])]
    return out
