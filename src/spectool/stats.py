"""The one home of spectool's statistics: what every decision it makes for a user rests on.

- Acceptance (`AcceptanceStats`): the one definition of speculative acceptance, shared by every command.
- verify's tests: is speculative sampling exactly the policy's sampling?
- sweep-k's decision: is an arm faster than plain decoding beyond the noise between engine runs?
- the `auto` refresh's ledger: did a refresh raise acceptance, against the previous draft on the same rollouts?

Pure functions on numbers (no engine, no model).

## Acceptance
Built from vLLM's own counters (deltas of `vllm:spec_decode_*` around a generate call), so the
numbers are the engine's, not a re-derivation. Mean acceptance length = 1 + accepted / drafts
(vllm/v1/spec_decode/metrics.py): tokens emitted per target verification step.

## verify
Two tests, each with a stated detectable effect:

1. Score test. For a token x drawn from p, s = log p(x) + H(p) has mean 0 (E[log p(x)] = -H(p)).
   The per-token scores of a rollout are martingale differences, so their mean over n tokens is
   ~ N(0, var/n) under exact sampling. We test each arm's mean against 0 and the two arms'
   means against each other (Welch). Sampling at the wrong temperature or with truncation moves
   the mean (colder -> s > 0, hotter -> s < 0). Detectable shift at 80% power: (z_a + z_0.8) * SE.
2. Token-distribution test. For one prompt and one position j, the j-th sampled token has the same
   marginal distribution with and without speculation iff sampling is lossless (a necessary
   condition). Chi-square test of homogeneity on the two count vectors (cells with pooled count
   < `min_cell` merged). Detectable total variation at 80% power is found by simulation.
All tests of one verdict share a Bonferroni-corrected family-wise level.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class AcceptanceStats:
    num_drafts: int = 0  # verification steps that carried draft tokens
    num_draft_tokens: int = 0  # draft tokens proposed
    num_accepted_tokens: int = 0  # draft tokens accepted
    accepted_per_pos: list[int] = field(default_factory=list)  # [k] accepted count at each position

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def per_position_rate(self) -> list[float]:
        """Fraction of drafts whose token at position i (0-based) was accepted."""
        return [a / self.num_drafts if self.num_drafts else float("nan") for a in self.accepted_per_pos]

    def _combine(self, other: "AcceptanceStats", sign: int) -> "AcceptanceStats":
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = self.accepted_per_pos + [0] * (n - len(self.accepted_per_pos))
        b = other.accepted_per_pos + [0] * (n - len(other.accepted_per_pos))
        return AcceptanceStats(
            self.num_drafts + sign * other.num_drafts,
            self.num_draft_tokens + sign * other.num_draft_tokens,
            self.num_accepted_tokens + sign * other.num_accepted_tokens,
            [x + sign * y for x, y in zip(a, b)],
        )

    def __sub__(self, other: "AcceptanceStats") -> "AcceptanceStats":
        return self._combine(other, -1)

    def __add__(self, other: "AcceptanceStats") -> "AcceptanceStats":
        return self._combine(other, +1)


# --- verify: is speculative sampling exactly the policy's? ------------------------------------------
Z_POWER_80 = 0.8416212335729143  # standard normal quantile at 0.8


def normal_two_sided_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


def normal_quantile(p: float) -> float:
    """Inverse standard normal CDF (bisection on erfc; exact enough for test thresholds)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def chi2_sf(x: float, df: int) -> float:
    """P(Chi2_df > x)."""
    import torch  # noqa: PLC0415 (heavy: the engine's modules import AcceptanceStats from here)

    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)))


@dataclass
class ScoreTest:
    mean: float
    se: float
    n: int

    @property
    def z(self) -> float:
        return self.mean / self.se if self.se > 0 else 0.0

    @property
    def p(self) -> float:
        return normal_two_sided_p(self.z)


def score_test(scores: list[float]) -> ScoreTest:
    """scores: log p(x_t) + H(p_t) for every sampled token. Mean 0 under exact sampling."""
    n = len(scores)
    if n < 2:
        return ScoreTest(float("nan"), float("inf"), n)
    m = sum(scores) / n
    var = sum((s - m) ** 2 for s in scores) / (n - 1)
    return ScoreTest(m, math.sqrt(var / n), n)


def welch(a: ScoreTest, b: ScoreTest) -> ScoreTest:
    """Difference of two arms' means (a - b) with its standard error."""
    return ScoreTest(a.mean - b.mean, math.sqrt(a.se**2 + b.se**2), a.n + b.n)


def detectable_shift(se: float, alpha: float) -> float:
    """Smallest true mean shift found with 80% power by a two-sided z-test at level alpha."""
    return (normal_quantile(1 - alpha / 2) + Z_POWER_80) * se


def _merged_table(a: list[int], b: list[int], min_cell: int) -> list[tuple[int, int]]:
    """Count vectors of two samples of tokens, as (count_a, count_b) cells; rare tokens pooled."""
    ca, cb = Counter(a), Counter(b)
    cells, other = [], [0, 0]
    for tok in sorted(set(ca) | set(cb)):
        if ca[tok] + cb[tok] >= min_cell:
            cells.append((ca[tok], cb[tok]))
        else:
            other[0] += ca[tok]
            other[1] += cb[tok]
    if sum(other) > 0:
        cells.append((other[0], other[1]))
    return cells


def chi2_homogeneity(cells: list[tuple[int, int]]) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of the 2 x C homogeneity test."""
    na, nb = sum(c[0] for c in cells), sum(c[1] for c in cells)
    if len(cells) < 2 or na == 0 or nb == 0:
        return 0.0, 0, 1.0
    n = na + nb
    stat = 0.0
    for x, y in cells:
        tot = x + y
        for obs, arm in ((x, na), (y, nb)):
            exp = tot * arm / n
            stat += (obs - exp) ** 2 / exp
    df = len(cells) - 1
    return stat, df, chi2_sf(stat, df)


@dataclass
class TokenTest:
    prompt: int
    position: int
    n_a: int
    n_b: int
    cells: int
    statistic: float
    df: int
    p: float
    tv: float  # observed total variation between the two empirical distributions (merged cells)
    pooled: list[float]  # pooled cell frequencies (the null's best estimate), for power analysis


def token_test(prompt: int, position: int, a: list[int], b: list[int], min_cell: int = 10) -> TokenTest:
    """Chi-square homogeneity of the j-th sampled token of one prompt, arm a vs arm b."""
    cells = _merged_table(a, b, min_cell)
    stat, df, p = chi2_homogeneity(cells)
    na, nb = max(len(a), 1), max(len(b), 1)
    tv = 0.5 * sum(abs(x / na - y / nb) for x, y in cells)
    n = max(len(a) + len(b), 1)
    pooled = [(x + y) / n for x, y in cells]
    return TokenTest(prompt, position, len(a), len(b), len(cells), stat, df, p, tv, pooled)


def detectable_tv(
    probs: list[float], n: int, alpha: float, power: float = 0.8, sims: int = 200, seed: int = 0
) -> float:
    """Smallest total variation d found with `power` by the chi-square test at level alpha, for
    n samples per arm from `probs` (merged cells) vs `probs` with mass d moved from its largest
    cell to its second largest (a hard case: big cells). Simulated; nan when untestable."""
    import torch  # noqa: PLC0415 (heavy: the engine's modules import AcceptanceStats from here)

    if len(probs) < 2 or n < 2:
        return float("nan")
    g = torch.Generator().manual_seed(seed)
    p = torch.tensor(probs, dtype=torch.float64)
    p = p / p.sum()
    order = torch.argsort(p, descending=True)
    i, j = int(order[0]), int(order[1])

    def rejects(d: float) -> float:
        q = p.clone()
        q[i] -= d
        q[j] += d
        a = torch.multinomial(p.expand(sims, -1), n, replacement=True, generator=g)
        b = torch.multinomial(q.expand(sims, -1), n, replacement=True, generator=g)
        hits = 0
        for s in range(sims):
            ca = torch.bincount(a[s], minlength=len(p)).tolist()
            cb = torch.bincount(b[s], minlength=len(p)).tolist()
            cells = [(x, y) for x, y in zip(ca, cb) if x + y > 0]
            hits += chi2_homogeneity(cells)[2] < alpha
        return hits / sims

    lo, hi = 0.0, float(p[i])
    if rejects(hi) < power:
        return float("nan")
    for _ in range(8):
        mid = (lo + hi) / 2
        if rejects(mid) >= power:
            hi = mid
        else:
            lo = mid
    return hi


# --- sweep-k: an arm against plain decoding, beyond the noise between engine runs -----------------


# --- the auto refresh: a refresh's gain, against the previous draft on the same rollouts ------------
