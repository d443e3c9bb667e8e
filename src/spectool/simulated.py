"""A simulated policy for calibrating verify's tests without an engine (tests/test_lossless.py and
benchmarks/verify_calibration.py `simulate`): a Markov chain over a small vocabulary whose next-token logits depend
on the previous token, and the samplers verify must tell apart, exact and lossy."""

from __future__ import annotations

import torch

SAMPLERS = ("exact", "truncated", "temperature", "offbyone")


def markov_policy(scale: float, seed: int = 1, vocab: int = 64) -> torch.Tensor:
    """Logits after each token: [vocab + 1, vocab], float64; row `vocab` is the prompt. `scale` sets the entropy
    (1: mean p(top) ~0.10; 60: ~0.998)."""
    return torch.randn(vocab + 1, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def sample_policy(chain: torch.Tensor, n: int, positions: int, sampler: str, g: torch.Generator):
    """n completions of `positions` tokens by `sampler` (one of SAMPLERS). Returns (logits [n * positions, V] in
    position-major order, tokens [n * positions], tokens as [n][positions] lists)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r}: expected one of {SAMPLERS}")
    vocab = chain.shape[1]
    prev, logits, tokens = torch.full((n,), vocab), [], []
    for _ in range(positions):
        lg = chain[prev]  # [n, V]
        p = torch.softmax(lg, -1)
        if sampler == "truncated":  # top-p 0.9
            sp, idx = p.sort(-1, descending=True)
            p = torch.zeros_like(p).scatter(-1, idx, sp * ((sp.cumsum(-1) - sp) < 0.9))
        elif sampler == "temperature":  # sampled 10% hotter
            p = torch.softmax(lg / 1.1, -1)
        elif sampler == "offbyone":  # the policy drafting itself, its argmax accepted against the next position's p
            d = p.argmax(-1)
            accept = torch.softmax(chain[d], -1).gather(-1, d[:, None])
            residual = p.scatter(-1, d[:, None], 0.0)
            p = residual / residual.sum(-1, keepdim=True) * (1 - accept) + torch.nn.functional.one_hot(d, vocab) * accept
        x = torch.multinomial(p, 1, generator=g)[:, 0]
        logits.append(lg)
        tokens.append(x)
        prev = x
    return torch.cat(logits), torch.cat(tokens), torch.stack(tokens, 1).tolist()


def policy_terms(chain: torch.Tensor, per: list[list[int]], temperature: float = 1.0) -> torch.Tensor:
    """stats.lossless.token_terms of sample_policy's completions `per` ([n][positions] token lists) under the chain: each of its
    vocab + 1 rows worked out once, so scoring costs a gather, not a softmax per token. Returns [n * positions, ...]
    (completion-major; the tests sum over tokens, so the order is theirs to ignore)."""
    from spectool.stats.lossless import token_terms  # noqa: PLC0415 (it imports torch lazily; so does this module's caller)

    vocab = chain.shape[1]
    rows = torch.tensor([prev for r in per for prev in [vocab] + r[:-1]], dtype=torch.int64)
    tokens = torch.tensor([x for r in per for x in r], dtype=torch.int64)
    return token_terms(chain, tokens, temperature, rows)
