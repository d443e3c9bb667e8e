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
# The auto refresh (draft/refresh_policy.py) decides after every RL step whether to retrain its draft, on one batch's
# acceptance a step: a noisy measurement whose noise the decisions below carry. Each rule fires only when its ledger
# clears the refresh's cost at a one-sided lower confidence bound, and the looks at one refresh cycle spend a
# false-refresh budget `alpha` (alpha / (m (m + 1)) at the m-th step since the refresh: the sum over any number of
# steps stays below alpha; a union bound). So a draft whose acceptance is only noise, or a refresh that bought
# nothing, triggers another refresh with probability at most alpha per cycle (normal noise; measured by
# benchmarks/refresh_placebo.py).
REFRESH_ALPHA = 0.05  # per refresh cycle, shared by the three rules
NOISE_WINDOW = 16  # successive differences of acceptance the step noise is estimated from (the newest)


def look_alpha(alpha: float, look: int) -> float:
    """The share of `alpha` the `look`-th look (1-based) spends: alpha / (look (look + 1)), summing to alpha."""
    return alpha / (look * (look + 1))


_T_QUANTILES: dict[tuple[float, int], float] = {}


def t_quantile(p: float, df: int) -> float:
    """The upper `p` quantile of Student's t with `df` degrees of freedom (df >= 1): t with P(T > t) = p.
    P(T > t) = c * integral from atan(t / sqrt(df)) to pi/2 of cos(u)^(df - 1) du, c = G((df+1)/2) / (sqrt(pi) G(df/2))
    (t = sqrt(df) tan u), integrated by Simpson's rule and inverted by bisection in u."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)

    def tail(u0: float, n: int = 256) -> float:
        h = (math.pi / 2 - u0) / n
        f = [math.cos(u0 + i * h) ** (df - 1) for i in range(n + 1)]
        return c * h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    if (p, df) not in _T_QUANTILES:  # the rules ask for few (p, df) pairs, at every step
        lo, hi = 0.0, math.pi / 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tail(mid) > p else (lo, mid)
        _T_QUANTILES[p, df] = math.sqrt(df) * math.tan((lo + hi) / 2)
    return _T_QUANTILES[p, df]


def step_noise(segments: list[list[float]], window: int = NOISE_WINDOW) -> tuple[float, int] | None:
    """One step's acceptance-length noise: (standard deviation, degrees of freedom), or None before two steps.
    `segments`: the acceptance per step of each stretch with one draft (a refresh starts a new one). Von Neumann's
    successive differences, sum (x_t - x_(t-1))^2 / (2 n) over the newest `window` differences inside the
    segments: a slow trend (the policy moving) barely enters, a refresh's jump not at all."""
    diffs = [b - a for seg in segments for a, b in zip(seg, seg[1:])][-window:]
    if not diffs:
        return None
    return math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs))), len(diffs)


@dataclass
class Ledger:
    """A refresh cycle's books after a step (seconds of generation; `_low`/`_high`: at the look's bound)."""

    cost_s: float | None  # the last refresh's own seconds (None: none yet)
    watch_s: float = 0.0  # the agreement measured since (rule 3 charges it to the refresh it judges)
    level: float | None = None  # rules 1-2: the line through the cycle's acceptance: at its first step (fresh)
    slope: float | None = None  # and per step since (< 0: going stale)
    fell: float | None = None  # rule 1: the acceptance gain's fall along the line, a fraction of `level` - 1
    fell_low: float | None = None
    lost_s: float | None = None  # rule 2: generation lost to staleness along the line (< 0: the draft gained)
    lost_low: float | None = None
    ratio: float | None = None  # rule 3: the previous draft's agreement-length gain over the new draft's
    ratio_high: float | None = None  # (< 1: the refresh helped), and its upper bound
    saved_low: float | None = None  # generation the refresh saved, at ratio_high


@dataclass
class Line:
    """Acceptance over the steps of a refresh cycle (x = 0: the fresh draft's step), least squares."""

    level: float  # at x = 0
    slope: float  # per step
    se: float  # the slope's standard error, from one step's noise


def fit_line(levels: list[float], sd: float) -> Line:
    """The least-squares line through `levels` at x = 0, 1, ...; the slope's standard error sd / sqrt(Sxx)."""
    n = len(levels)
    mx, my = (n - 1) / 2, sum(levels) / n
    sxx = sum((x - mx) ** 2 for x in range(n))
    slope = sum((x - mx) * (y - my) for x, y in enumerate(levels)) / sxx
    return Line(my - slope * mx, slope, sd / math.sqrt(sxx))


def acceptance_fall(line: Line, steps: int, t: float) -> tuple[float, float]:
    """Rule 1: how far the acceptance gain over plain decoding (AL - 1) fell along the line over `steps` steps from
    the fresh draft's, as a fraction of its gain there; and that fall with the slope at its bound (`t` standard
    errors up)."""
    return -line.slope * steps / (line.level - 1), -(line.slope + t * line.se) * steps / (line.level - 1)


def staleness_loss(line: Line, gen_s: list[float], t: float) -> tuple[float, float]:
    """Rule 2: generation seconds lost to staleness over a cycle's steps (generation seconds g at x = 0, 1, ...):
    a step at x ran at level + slope x against the fresh draft's level, so it lost g (1 - (level + slope x) /
    level) = -slope g x / level; signed, so that a draft that holds its level books about 0. And the sum with the
    slope at its bound (`t` standard errors up)."""
    s = sum(g * x for x, g in enumerate(gen_s)) / line.level
    return -line.slope * s, -(line.slope + t * line.se) * s


def ratio_of_gains(new: list[float], previous: list[float]) -> tuple[float, float, int]:
    """Rule 3's measurement: the previous draft's agreement length gain over the new draft's, sum(previous) /
    sum(new), over units (prompts) where both drafts read the same newest rollouts; with its standard error
    (the ratio estimator's linearisation: residuals previous - ratio * new) and the number of units."""
    n, total = len(new), sum(new)
    ratio = sum(previous) / total
    resid = [p - ratio * x for x, p in zip(new, previous)]
    se = math.sqrt(sum(e * e for e in resid) / (n * (n - 1))) / (total / n)
    return ratio, se, n


def saved_by_refresh(steps: list[tuple[float, float]], ratio: float) -> float:
    """Rule 3: generation seconds the refresh saved over `steps` (acceptance a with the new draft, generation
    seconds g), had the previous draft run instead at 1 + (a - 1) * ratio: g (a / b - 1) each (a verify step emits
    a tokens with the new draft, b with the previous, and costs the same)."""
    return sum(g * (a / (1 + (a - 1) * ratio) - 1) for a, g in steps)
