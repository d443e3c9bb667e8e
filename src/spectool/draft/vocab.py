"""The draft vocabulary: the most frequent tokens of the policy's own responses.

vLLM maps a draft id to a target id as target_id = draft_id + d2t[draft_id] (int64 offsets,
llama_eagle3.py `compute_logits`). Draft ids are assigned in increasing target-id order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch

from spectool.errors import SpectoolError


def build_vocab(responses: Iterable[list[int]], vocab_size: int, draft_vocab_size: int) -> tuple[torch.Tensor, float]:
    """Pick `draft_vocab_size` target ids. Returns (sorted target ids [Vd] int64, coverage).

    Coverage is the fraction of response tokens that the draft vocabulary can propose.
    """
    if not 1 <= draft_vocab_size <= vocab_size:
        raise SpectoolError(f"--draft-vocab-size={draft_vocab_size} must be in [1, {vocab_size}] (the policy's vocab)")
    counts: Counter[int] = Counter()
    for ids in responses:
        counts.update(ids)
    total = sum(counts.values())
    if total == 0:
        raise SpectoolError("no response tokens to build a draft vocabulary from; harvest more data")
    chosen = [t for t, _ in counts.most_common(draft_vocab_size) if 0 <= t < vocab_size]
    if len(chosen) < draft_vocab_size:  # fill with the lowest unused ids (special tokens first)
        used = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in used][: draft_vocab_size - len(chosen)]
    ids = torch.tensor(sorted(chosen), dtype=torch.int64)
    coverage = sum(counts[t] for t in chosen) / total
    return ids, coverage


def d2t_from_ids(target_ids: torch.Tensor) -> torch.Tensor:
    """Offsets with target_id = draft_id + d2t[draft_id]."""
    return target_ids - torch.arange(len(target_ids), dtype=torch.int64)


def ids_from_d2t(d2t: torch.Tensor) -> torch.Tensor:
    return torch.arange(len(d2t), dtype=torch.int64, device=d2t.device) + d2t

