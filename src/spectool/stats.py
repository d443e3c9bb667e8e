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

import functools
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

# The lossy samplers the likelihood-ratio test looks for, each a distribution made from the policy's own p at every
# position: ("temperature", r) samples at T' = r * T instead of T (p^(1/r), renormalised); ("top-p", c) keeps the
# smallest set of top tokens holding mass >= c (the nucleus) and renormalises; c = 0 keeps the top token only (greedy).
# Larger temperature errors are caught by the nearest ratio here (its likelihood ratio grows the same way).
ALTERNATIVES = tuple([("temperature", r) for r in (0.75, 0.9, 0.95, 1.05, 1.1, 1.25)]
                     + [("top-p", c) for c in (0.0, 0.5, 0.8, 0.9, 0.95, 0.99)])
GREEDY = ALTERNATIVES.index(("top-p", 0.0))
# Columns of token_terms' rows: the score, its variance under p, -log p(top), whether the token is the top one, then
# per alternative: the token's log likelihood ratio, and its mean and variance under the alternative sampler.
SCORE, SCORE_VAR, NEG_LOG_TOP, IS_TOP, TERMS = 0, 1, 2, 3, 4


def normal_two_sided_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def normal_quantile(p: float) -> float:
    """Inverse standard normal CDF (bisection on erfc; exact enough for test thresholds)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if normal_cdf(mid) < p:
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


def token_terms(logits, tokens, temperature: float, rows=None):
    """What the tests need of each sampled token, from the policy's own distribution p = softmax(logits / T).

    logits: [u, V] at u positions (any float dtype; computed in float64: near-deterministic positions have 1 - p(top)
    far below float32's resolution; a few hundred rows a call, the caller chunks); tokens: [n] int64; rows: [n] the
    position (row of logits) each token was drawn at, so that a distribution many tokens share (every sample's first
    position; a concentrated policy's common prefixes) is worked out once (default: token i at row i).
    Returns [n, TERMS + 3 * len(ALTERNATIVES)] float64 (the columns above).
    """
    import torch  # noqa: PLC0415 (heavy: the engine's modules import AcceptanceStats from here)

    rows = torch.arange(len(tokens)) if rows is None else rows.to(torch.int64)
    x = tokens.to(torch.int64)[:, None]
    rt = _row_terms(logits, temperature)
    lp = rt["lp"][rows]  # [n, V]
    lpx = lp.gather(-1, x)  # [n, 1] log p(x)
    ahead = (lp > lpx) | ((lp == lpx) & (torch.arange(lp.shape[-1])[None] < x))  # places before x in p's order
    above = (lp.exp() * ahead).sum(-1)  # [n] the mass ahead of x
    is_top = ~ahead.any(-1)
    lpx = lpx[:, 0]
    cols = [lpx + rt["entropy"][rows], rt["var"][rows], rt["neg_log_kept"][rows, 0], is_top.to(torch.float64)]
    llr, mean, var_alt = [], [], []
    for kind, v in ALTERNATIVES:
        if kind == "top-p":  # p_c(x) / p(x) = 1 / (mass kept) inside the nucleus, 0 outside
            nk = rt["neg_log_kept"][rows, TOP_P_LEVELS.index(v)]
            llr.append(torch.where(is_top | (above < v), nk, torch.full_like(nk, -math.inf)))
            mean.append(nk)
            var_alt.append(torch.zeros_like(nk))
        else:  # p_theta(x) / p(x) = p(x)^(theta - 1) / sum_y p(y)^theta
            t = TEMPERATURE_RATIOS.index(v)
            llr.append((1.0 / v - 1) * lpx - rt["log_z"][rows, t])
            mean.append(rt["kl"][rows, t])
            var_alt.append(rt["kl_var"][rows, t])
    return torch.stack(cols + llr + mean + var_alt, -1)


TOP_P_LEVELS = tuple(v for k, v in ALTERNATIVES if k == "top-p")
TEMPERATURE_RATIOS = tuple(v for k, v in ALTERNATIVES if k == "temperature")


def _neg_log_kept(top, cum, total, c: float):
    """-log of the mass the nucleus at level c keeps, per row. top: [u, K] probabilities in descending order, cum:
    their running sums, total: [u, 1] each row's whole mass. The mass past the nucleus is taken from the total, not
    summed up to c: at a near-deterministic position it is 1 - p(top), far below 1's float64 resolution when summed."""
    import torch  # noqa: PLC0415 (heavy: the engine's modules import AcceptanceStats from here)

    last = ((cum - top) < c).sum(-1, keepdim=True).clamp_min(1) - 1  # the nucleus's last place
    return -torch.log1p(-(total - cum.gather(-1, last))[:, 0].clamp(0.0, 1.0))


def _row_terms(logits, temperature: float) -> dict:
    """Per distribution (row): entropy, variance of log p, -log (mass kept) per top-p level, and per temperature
    ratio log Z, the tilted sampler's KL from p and the variance of its log likelihood ratio. logits: [u, V]."""
    import torch  # noqa: PLC0415 (heavy: the engine's modules import AcceptanceStats from here)

    lp = torch.log_softmax(logits.to(torch.float64) / temperature, -1)  # [u, V]
    p = lp.exp()
    ent = -(p * lp).sum(-1)
    var = ((p * lp * lp).sum(-1) - ent**2).clamp_min(0.0)
    # nucleus masses: the top K places cover the levels at all but the flattest positions; those get a full sort
    top = p.topk(min(lp.shape[-1], 1024), -1).values  # [u, K] descending
    cum = top.cumsum(-1)
    flat = ((cum - top)[:, -1] < max(TOP_P_LEVELS)).nonzero()[:, 0].tolist()
    neg_log_kept = torch.stack([_neg_log_kept(top, cum, p.sum(-1, keepdim=True), c) for c in TOP_P_LEVELS], -1)
    if flat:
        whole = p[flat].sort(-1, descending=True).values
        neg_log_kept[flat] = torch.stack([_neg_log_kept(whole, whole.cumsum(-1), p[flat].sum(-1, keepdim=True), c)
                                          for c in TOP_P_LEVELS], -1)
    # temperature tilts: float32 passes (their rounding, ~1e-7 per token, is far below the evidence a test needs)
    lp32 = lp.float()
    moments = torch.stack([torch.ones_like(lp32), lp32, lp32 * lp32], -1)  # [u, V, 3]
    log_z, kl, kl_var = [], [], []
    for r in TEMPERATURE_RATIOS:
        theta = 1.0 / r
        s = torch.bmm(torch.exp(theta * lp32)[:, None, :], moments)[:, 0].double()  # [u, 3] sums of p^theta * lp^i
        lz = s[:, 0].log()
        m1, m2 = s[:, 1] / s[:, 0], s[:, 2] / s[:, 0]
        log_z.append(lz)
        kl.append((theta - 1) * m1 - lz)  # KL(p_theta || p): the mean log likelihood ratio under the tilted sampler
        kl_var.append((theta - 1) ** 2 * (m2 - m1**2).clamp_min(0.0))
    return {"lp": lp, "entropy": ent, "var": var, "neg_log_kept": neg_log_kept,
            "log_z": torch.stack(log_z, -1), "kl": torch.stack(kl, -1), "kl_var": torch.stack(kl_var, -1)}


@dataclass
class ScoreTest:
    """Mean of the scores log p(x) + H(p) (0 under exact sampling) with its standard error under p itself."""

    mean: float
    se: float
    n: int

    @property
    def z(self) -> float:
        if self.se > 0:
            return self.mean / self.se
        # se 0: every position deterministic (the only token's score is 0), or float-equal scores; a nonzero mean
        # is then infinitely many standard errors away, not 0 of them
        return 0.0 if self.mean == 0 else math.copysign(math.inf, self.mean)

    @property
    def p(self) -> float:
        return normal_two_sided_p(self.z)


def score_test(scores: list[float], variances: list[float] | None = None) -> ScoreTest:
    """scores: log p(x_t) + H(p_t) for every sampled token, mean 0 under exact sampling. variances: Var_p of each
    score (the policy's own); without them the sample variance."""
    n = len(scores)
    if n < 1 or (variances is None and n < 2):
        return ScoreTest(float("nan"), float("inf"), n)
    m = sum(scores) / n
    if variances is not None:
        return ScoreTest(m, math.sqrt(sum(variances)) / n, n)
    var = sum((s - m) ** 2 for s in scores) / (n - 1)
    return ScoreTest(m, math.sqrt(var / n), n)


@dataclass
class PolicyTest:
    """One arm's tokens against the policy's own distributions: a likelihood-ratio test mixed over ALTERNATIVES.
    Sums over the arm's tokens of token_terms' columns."""

    n: int
    p: float  # mixture_p(log_evidence)
    best: str  # the alternative the tokens support most, in words
    log_evidence: list[float]  # per alternative: log prod_t p_alt(x_t) / p(x_t)
    expected: list[float]  # per alternative: its mean under that sampler at these positions (sum of KL)
    spread: list[float]  # per alternative: its standard deviation there
    score: ScoreTest  # log p + H: descriptive (the evidence above is the test)
    top_share: float  # fraction of the tokens that were the policy's top token
    mean_top: float  # mean p(top) over the positions

    def power(self, alpha: float) -> list[float]:
        """Per alternative: the probability that a sampler of that kind, at these positions, is rejected at level
        alpha (normal approximation of its log likelihood ratio; exact for a truncation, whose ratio is fixed)."""
        need = math.log(len(ALTERNATIVES) / alpha)  # the mean reaches 1/alpha when one ratio reaches G/alpha
        return [float(m >= need) if s == 0 else normal_cdf((m - need) / s) for m, s in zip(self.expected, self.spread)]

    def detectable(self, alpha: float, power: float = 0.8) -> dict[str, str]:
        """The smallest errors of each kind found with `power` here, in words ("none" where no alternative is)."""
        pw = dict(zip(ALTERNATIVES, self.power(alpha)))
        found = [a for a in ALTERNATIVES if pw[a] >= power]
        colder = [r for k, r in found if k == "temperature" and r < 1]
        hotter = [r for k, r in found if k == "temperature" and r > 1]
        top_p = [c for k, c in found if k == "top-p"]
        return {"colder": f"T' <= {max(colder)} T" if colder else "none",
                "hotter": f"T' >= {min(hotter)} T" if hotter else "none",
                "truncated": (f"top-p <= {max(top_p)}" if max(top_p) > 0 else "greedy only") if top_p else "none"}

    def greedy_detectable(self, alpha: float) -> bool:
        """Whether a sampler that always emitted the policy's top token would have been rejected here: with too few
        positions where anything else is likely (a near-deterministic policy) nothing can be told."""
        return self.power(alpha)[GREEDY] >= 1.0


def mixture_p(log_evidence: list[float]) -> float:
    """1 / (mean over alternatives of the likelihood ratio), capped at 1. Under exact sampling each likelihood ratio
    is a nonnegative martingale of mean 1 over the tokens, so is their mean, and P(mean >= 1/a) <= a (Ville's
    inequality): at any entropy, sample size or dependence between positions.

    Non-finite evidence fails closed: a NaN (a NaN logit in the scoring) gives a NaN p-value, which the verdict
    reads as a failed test, never as a pass (Python's `max` would skip a NaN that is not first and let the others
    decide); +inf (a token the policy gives probability 0) gives p 0."""
    if any(math.isnan(e) for e in log_evidence):
        return math.nan
    top = max(log_evidence)
    if top == math.inf:
        return 0.0
    if top == -math.inf:
        return 1.0
    log_mean = top + math.log(sum(math.exp(e - top) for e in log_evidence) / len(log_evidence))
    return min(1.0, math.exp(-log_mean))


def describe(kind: str, v: float) -> str:
    if kind == "top-p":
        return "greedy" if v == 0 else f"top-p {v}"
    return f"temperature {v} T"


def policy_test(terms) -> PolicyTest:
    """terms: [n, ...] token_terms rows of one arm's tokens (a tensor)."""
    g = len(ALTERNATIVES)
    n = int(terms.shape[0])
    if n == 0:
        return PolicyTest(0, 1.0, "-", [0.0] * g, [0.0] * g, [0.0] * g, ScoreTest(float("nan"), float("inf"), 0),
                          float("nan"), float("nan"))
    s = terms.sum(0)
    evidence = s[TERMS:TERMS + g].tolist()
    return PolicyTest(
        n=n,
        p=mixture_p(evidence),
        best=describe(*ALTERNATIVES[max(range(g), key=lambda i: evidence[i])]),
        log_evidence=evidence,
        expected=s[TERMS + g:TERMS + 2 * g].tolist(),
        spread=s[TERMS + 2 * g:TERMS + 3 * g].clamp_min(0).sqrt().tolist(),
        score=ScoreTest(float(s[SCORE]) / n, math.sqrt(float(s[SCORE_VAR])) / n, n),
        top_share=float(s[IS_TOP]) / n,
        mean_top=float((-terms[:, NEG_LOG_TOP]).exp().mean()),
    )


def _merged_table(a: list[int], b: list[int], min_cell: int) -> list[tuple[int, int]]:
    """Count vectors of two samples of tokens, as (count_a, count_b) cells; rare tokens pooled, and a pool still under
    min_cell folded into the smallest cell, so every cell's expected counts are large enough for the chi-square
    approximation (at a concentrated position the pool holds a few draws: 1-2 expected, far in the tail at the
    levels a verdict tests at)."""
    ca, cb = Counter(a), Counter(b)
    cells, other = [], [0, 0]
    for tok in sorted(set(ca) | set(cb)):
        if ca[tok] + cb[tok] >= min_cell:
            cells.append((ca[tok], cb[tok]))
        else:
            other[0] += ca[tok]
            other[1] += cb[tok]
    if sum(other) >= min_cell or (not cells and sum(other) > 0):
        cells.append((other[0], other[1]))
    elif sum(other) > 0:
        i = min(range(len(cells)), key=lambda c: sum(cells[c]))
        cells[i] = (cells[i][0] + other[0], cells[i][1] + other[1])
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
    p: float  # the chi-square law's, or the permutations' where the law's is below 0.01 (1.0 where left unresolved)
    tv: float  # observed total variation between the two empirical distributions (merged cells)
    pooled: list[float]  # pooled cell frequencies (the null's best estimate), for power analysis
    law_p: float = 1.0  # the chi-square law's p-value (unresolved by permutations: evidence of power, not the level)
    resolved: bool = True  # False: the law's p is below 0.01 and no permutations were run (p 1.0, never a rejection)


RESOLUTION = 0.01  # a token test's permutation p-value is resolved to this share of the level it is read at
FIRST_LOOK, GROWTH = 1000, 1.25  # the sequential permutations' looks: 1,000 relabellings, then 25% more at each


def token_test(prompt: int, position: int, a: list[int], b: list[int], min_cell: int = 10,
               permutations: int = 20000, level: float | None = None) -> TokenTest:
    """Homogeneity of the j-th sampled token of one prompt, arm a vs arm b: Pearson's chi-square statistic, its p-value
    from the chi-square law, or, where that is small (< 0.01), from random relabellings of the pooled draws (valid for
    any counts: the chi-square law's tail is too thin at small counts, e.g. 19 of 25 against 6 of 25 gets p 2.4e-4
    from it and 5.4e-4 from the permutations, Fisher's exact test's value; a verdict tests at ~4e-4).
    level None: all `permutations` relabellings (a point estimate). level given (the level the caller reads p at):
    sequential, at most `permutations`, stopped once p is resolved against the level (_sequential_permutation_p).
    permutations 0: none are run; a test that would need them is left unresolved (p 1.0, resolved False)."""
    cells = _merged_table(a, b, min_cell)
    stat, df, law_p = chi2_homogeneity(cells)
    p, resolved = law_p, True
    if law_p < 0.01 and permutations == 0:
        p, resolved = 1.0, False
    elif law_p < 0.01:
        seed = prompt * 1009 + position
        p = (_permutation_p(cells, stat, permutations, seed) if level is None
             else _sequential_permutation_p(cells, stat, permutations, seed, level))
    na, nb = max(len(a), 1), max(len(b), 1)
    tv = 0.5 * sum(abs(x / na - y / nb) for x, y in cells)
    n = max(len(a) + len(b), 1)
    pooled = [(x + y) / n for x, y in cells]
    return TokenTest(prompt, position, len(a), len(b), len(cells), stat, df, p, tv, pooled, law_p, resolved)


def _relabelled_hits(cells: list[tuple[int, int]], stat: float, rng, m: int) -> int:
    """Of m random splits of the pooled draws into the two arms' sizes (the conditional null of homogeneity: arm a's
    counts are multivariate hypergeometric), how many reach the chi-square statistic `stat`."""
    import numpy as np  # noqa: PLC0415 (loaded with torch; only on this path)

    totals = np.array([x + y for x, y in cells], dtype=np.int64)
    na, n = sum(c[0] for c in cells), int(totals.sum())
    exp_a = totals * na / n
    weight = 1 / exp_a + 1 / (totals - exp_a)  # arm b's deviation is minus arm a's: the statistic is d^2 . weight
    hits = 0
    for at in range(0, m, 100_000):
        d = rng.multivariate_hypergeometric(totals, na, size=min(100_000, m - at)) - exp_a  # [m', cells]
        hits += int(((d * d) @ weight >= stat * (1 - 1e-12)).sum())
    return hits


def _permutation_p(cells: list[tuple[int, int]], stat: float, permutations: int, seed: int) -> float:
    """P(chi-square statistic >= stat) over `permutations` random relabellings, (1 + hits) / (1 + permutations): a
    valid p-value for any number of draws."""
    import numpy as np  # noqa: PLC0415 (loaded with torch; only on this path)

    hits = _relabelled_hits(cells, stat, np.random.default_rng(seed), permutations)
    return (1 + hits) / (1 + permutations)


def _sequential_permutation_p(cells: list[tuple[int, int]], stat: float, permutations: int, seed: int,
                              level: float) -> float:
    """The permutation p-value, sequential (Monte Carlo with a bounded resampling risk, after Gandy 2009): relabellings
    are drawn at looks of FIRST_LOOK, then GROWTH times more, up to `permutations`, and stop at the first look where
    the p-value is resolved against `level`. Returns U + risk, where U is the Clopper-Pearson upper bound on pi (the
    share of all relabellings reaching stat, the exact permutation p-value) at risk / looks, risk = level *
    RESOLUTION. Valid at any stop: U < pi at some look with probability at most `risk` (a union over the looks), so
    P(U + risk <= a) <= P(pi <= a - risk) + risk <= a under homogeneity. Resolved: U + risk < level (rejects), or
    the lower bound on pi above level (cannot reject). A test far in the tail stops after ~ln(looks / risk) / level
    relabellings (~19 / level), against 2 / (level * RESOLUTION) = 200 / level run in full."""
    import numpy as np  # noqa: PLC0415 (loaded with torch; only on this path)

    looks = [min(FIRST_LOOK, permutations)]
    while looks[-1] < permutations:
        looks.append(min(permutations, math.ceil(looks[-1] * GROWTH)))
    risk = level * RESOLUTION
    each = risk / len(looks)  # every look's bound may fail with this probability: a union over them
    rng, hits, done = np.random.default_rng(seed), 0, 0
    for n in looks:
        hits += _relabelled_hits(cells, stat, rng, n - done)
        done = n
        below = binomial_cdf(hits, n, level - risk) < each  # U < level - risk: p = U + risk < level
        above = 1.0 - binomial_cdf(hits - 1, n, level) < each  # the lower bound on pi is above level
        if below or above:
            break
    return min(1.0, binomial_bound(hits, done, each, upper=True) + risk)


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


def binomial_cdf(x: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= x) = I_(1-p)(n - x, x + 1), any n."""
    if x < 0:
        return 0.0
    return 1.0 if x >= n else _betainc(n - x, x + 1, 1.0 - p)


def binomial_bound(k: int, n: int, risk: float, upper: bool) -> float:
    """One-sided Clopper-Pearson bound on a rate seen k times in n: the upper bound is below the rate with probability
    at most `risk`, and so is the lower bound above it (bisection: the cdf falls as p rises)."""
    if n == 0 or (upper and k == n) or (not upper and k == 0):
        return 1.0 if upper else 0.0
    x, target = (k, risk) if upper else (k - 1, 1 - risk)  # upper: P(X <= k) = risk; lower: P(X >= k) = risk
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if binomial_cdf(x, n, mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def binomial_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact) interval for a rate of k in n: what a calibration's false-alarm rate and power are
    reported with."""
    if n == 0:
        return 0.0, 1.0
    tail = (1 - level) / 2
    return binomial_bound(k, n, tail, upper=False), binomial_bound(k, n, tail, upper=True)


# --- sweep-k: an arm against plain decoding, beyond the noise between engine runs -----------------
# Design (sweep-k): `repeats` rounds; each round runs plain decoding and every arm in a fresh engine, one after the
# other (the order reversed every other round), all on the same prompts and seeds by wave. Per batch size and round,
# every engine's rate is taken over the waves all of them decoded (paired by wave). Log rates follow a block design:
# y[a][r] = mu_a + rho_r + e[a][r] (rho_r: the machine during round r, shared by its engines; e[a][r]: one engine
# run's own noise, which holds the noise between waves too). The machine cancels in each paired difference d[r] =
# y[a][r] - y[plain][r]; an arm's log speedup is their mean over rounds, with the standard error of that arm's own
# differences, sd(d) / sqrt(R) on R - 1 degrees of freedom (Student's t: the paired t). The assumption: the rounds'
# e are independent and normal, each engine with its own variance (engines are not equally noisy: a draft's runs
# varied 40.6% against plain decoding's 10.6% at batch 4 on this CPU, benchmarks/data/sweep_calibration.txt; one
# residual mean square pooled over the arms x rounds table gives every arm the average noise, too little for a noisy
# plain engine or arm). Its lower bound counts every arm compared at that batch size (Bonferroni: one-sided level
# alpha / arms), so the chance that any arm is recommended when none is faster is at most alpha per batch size,
# whatever the arms' noise and however they correlate through plain decoding. One round measures no noise between
# runs, and differences identical in every round (a standard error of 0) measure none either: neither gets a bound,
# so neither recommends anything.

SWEEP_ALPHA = 0.05  # the recommendation's false-alarm rate per batch size, every arm it looked at counted


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Lentz's continued fraction)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, c, d = 1e-300, 1.0, 0.0
    f = 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c if abs(c) > tiny else 1.0 + num / tiny
        f = (c * d) if i == 0 else f * c * d
        if i > 0 and abs(c * d - 1.0) < 1e-14:
            break
    return front * (f - 1.0)


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom."""
    tail = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=8192)
def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection; cached: the refresh rule asks for a few (p, df) at every step)."""
    lo, hi = -1e4, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1.0 - student_t_sf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class ArmSpeedup:
    speedup: float  # exp(the mean over rounds of log(arm rate / plain rate)), paired by round and wave
    lo: float  # one-sided lower bound at level 1 - alpha / arms (nan: one round or se 0, no noise measured)
    hi: float  # the same distance above
    se: float  # standard error of the log speedup
    df: int  # degrees of freedom of the arm's noise estimate: rounds - 1
    rounds: int
    arms: int  # speculative arms compared at this batch size (what the bound counts)


def paired_log_rates(waves: list[list[list[float]]]) -> list[float]:
    """waves[a]: one round's timed waves [tokens, seconds] of engine a (plain first), wave i of every engine on the
    same prompts and seed. The log tokens/s of each engine over the waves all of them decoded."""
    n = min(len(w) for w in waves)
    return [math.log(sum(t for t, _ in w[:n]) / sum(s for _, s in w[:n])) for w in waves]


def block_speedups(log_rates: list[list[float]], alpha: float = SWEEP_ALPHA) -> list[ArmSpeedup]:
    """log_rates[r][a]: round r's paired log rate of engine a (0: plain decoding, 1..m: the arms), complete rounds
    only. Each arm's speedup over plain decoding with its lower bound from its own paired differences, every arm
    counted (the design above). No bound (nan) with one round or a standard error of 0."""
    rounds, engines = len(log_rates), len(log_rates[0])
    arms, df = engines - 1, rounds - 1
    out = []
    for a in range(1, engines):
        d = [row[a] - row[0] for row in log_rates]  # [rounds]: the machine's round effect cancels
        mean = sum(d) / rounds
        se = math.sqrt(sum((x - mean) ** 2 for x in d) / (df * rounds)) if df else float("nan")
        if df == 0 or se == 0:  # no noise measured: the point estimate alone decides nothing
            out.append(ArmSpeedup(math.exp(mean), float("nan"), float("nan"), se, df, rounds, arms))
            continue
        q = student_t_quantile(1 - alpha / arms, df)
        out.append(ArmSpeedup(math.exp(mean), math.exp(mean - q * se), math.exp(mean + q * se), se, df, rounds, arms))
    return out


def sweep_speedups(rows: list[dict], alpha: float = SWEEP_ALPHA) -> list[dict]:
    """A sweep's measured rows (one per engine run: method, k, batch, run = its round, waves) -> one row per
    (method, k, batch size), its rounds pooled for tokens/s and acceptance (what forecast fits), plain decoding's
    carrying `drift` (its last round's tokens/s over its first). On every speculative row: `speedup` over plain
    decoding from the complete rounds (`block_speedups`), `speedup_lo`/`speedup_hi` where two or more rounds
    measured the noise between runs, `rounds`, and `ceiling`. Sorted by batch size, plain first."""
    from spectool.costmodel import ceiling  # noqa: PLC0415 (the cost model's arithmetic; it imports nothing of this)

    out = []
    for b in sorted({r["batch"] for r in rows}):
        at = [r for r in rows if r["batch"] == b]
        plain = sorted((r for r in at if r["method"] == "none"), key=lambda r: r.get("run", 0))
        arms = sorted({(r["method"], r["k"]) for r in at if r["method"] != "none"})
        runs = {(r["method"], r["k"], r.get("run", 0)): r for r in at}
        if plain:
            out.append({**_pooled(plain), "speedup": 1.0, "ceiling": 1.0})
        complete = sorted(r.get("run", 0) for r in plain
                          if all((m, k, r.get("run", 0)) in runs for m, k in arms))
        waves = all("waves" in runs[(m, k, n)] for m, k in [("none", 0), *arms] for n in complete)
        fits = block_speedups([paired_log_rates([runs[(m, k, n)]["waves"] for m, k in [("none", 0), *arms]])
                               for n in complete], alpha) if complete and waves and arms else None
        for i, (m, k) in enumerate(arms):
            row = _pooled(sorted((r for r in at if (r["method"], r["k"]) == (m, k)), key=lambda r: r.get("run", 0)))
            row.pop("drift", None)
            if fits:
                row["speedup"], row["rounds"] = fits[i].speedup, fits[i].rounds
                if not math.isnan(fits[i].lo):
                    row["speedup_lo"], row["speedup_hi"] = fits[i].lo, fits[i].hi
            else:
                row["speedup"] = row["tokens_per_s"] / out[-1]["tokens_per_s"] if plain else float("nan")
                row["rounds"] = 0
            row["ceiling"] = ceiling(row["speedup"], k, row["mean_acceptance_length"])
            out.append(row)
    return out


def _pooled(runs: list[dict]) -> dict:
    """One engine's runs (its rounds) at one batch size as one row: tokens, seconds and waves summed, acceptance
    averaged over the rounds; `drift`: the last round's tokens/s over the first's; `measured_from`/`_to`: the first
    and last run's time."""
    row = dict(runs[0])
    row.pop("run", None)
    times = sorted(r["measured_at"] for r in runs if "measured_at" in r)  # ISO 8601 UTC: sorts as text
    row.pop("measured_at", None)
    if times:
        row["measured_from"], row["measured_to"] = times[0], times[-1]
    row["tokens"], row["seconds"] = sum(r["tokens"] for r in runs), sum(r["seconds"] for r in runs)
    row["tokens_per_s"], row["sequences"] = row["tokens"] / row["seconds"], sum(r["sequences"] for r in runs)
    if all("waves" in r for r in runs):
        row["waves"] = [w for r in runs for w in r["waves"]]
    lengths = [r["mean_acceptance_length"] for r in runs if r.get("mean_acceptance_length") is not None]
    row["mean_acceptance_length"] = sum(lengths) / len(lengths) if lengths else None
    pos = [r["per_position"] for r in runs if r.get("per_position")]
    row["per_position"] = [sum(p[j] for p in pos) / len(pos) for j in range(min(map(len, pos)))] if pos else []
    if len(runs) > 1:
        row["drift"] = runs[-1]["tokens_per_s"] / runs[0]["tokens_per_s"]
    return row


def recommend(rows: list[dict], batch_sizes: list[int], min_gain: float, method: str | None = None) -> dict[int, dict]:
    """Per batch size: the fastest speculative row (optionally of one method) whose lower bound (`speedup_lo`:
    every arm of the sweep at that batch size counted, `sweep_speedups`) clears 1 + min_gain. Else
    {"method": "none", "k": 0, "speedup": 1.0, "why": the best row and why not}. A row without a bound (one
    round: the noise between engine runs unmeasured) is never recommended."""
    rec = {}
    for b in batch_sizes:
        cands = [r for r in rows if r["batch"] == b and r["method"] != "none" and (method is None or r["method"] == method)]
        sure = [r for r in cands if r.get("speedup_lo", 0.0) >= 1 + min_gain]
        best = max(sure, key=lambda r: r["speedup"], default=None)
        if best is not None:
            rec[b] = {"method": best["method"], "k": best["k"], "speedup": best["speedup"],
                      "interval": [best["speedup_lo"], best["speedup_hi"]]}
        else:
            rec[b] = {"method": "none", "k": 0, "speedup": 1.0, "why": _why_none(cands, min_gain)}
    return rec


def _why_none(cands: list[dict], min_gain: float) -> str:
    top = max(cands, key=lambda r: r["speedup"], default=None)
    if top is None:
        return "nothing speculative was measured"
    what = f"{top['method']} k={top['k']} measured {top['speedup']:.2f}x"
    if "speedup_lo" not in top and top.get("rounds", 0) >= 2:
        return what + (f": its speedup was the same in all {top['rounds']} rounds (a standard error of 0), which "
                       "measures no noise between engine runs, so no gain can be told from it (rows copied from one run?)")
    if "speedup_lo" not in top:
        return what + (": one round per engine measures no noise between engine runs, so no gain can be told from "
                       "it (--repeats 2 or more)")
    what += f" [{top['speedup_lo']:.2f}, {top['speedup_hi']:.2f}]"
    if top["speedup_hi"] < 1:
        return what + ": slower than plain decoding"
    if top["speedup"] < 1 + min_gain:
        return what + f": not {min_gain:.0%} faster than plain decoding"
    return what + f": its lower bound is below {1 + min_gain:.2f}x, so the gain is within the noise between runs"


# --- the auto refresh: a refresh's gain, against the previous draft on the same rollouts ------------
# The auto refresh (draft/refresh_policy.py) decides after every RL step whether to retrain its draft, on one batch's
# acceptance a step: a noisy measurement whose noise the decisions below carry. Each rule fires only when its ledger
# clears the refresh's cost at a one-sided lower confidence bound, and the looks at one refresh cycle spend a
# false-refresh budget `alpha` (alpha / (m (m + 1)) at the m-th step since the refresh: the sum over any number of
# steps stays below alpha; a union bound). So a draft whose acceptance is only noise, or a refresh that bought
# nothing, triggers another refresh with probability at most alpha per cycle. The assumption: one step's acceptance
# noise is normal and stationary, independent between steps or correlated as an AR(1) series whose lag-1 correlation
# the run's own successive differences estimate (step_noise; the slope's se and df carry it); measured with
# independent and AR(1) steps (rho 0.3, 0.6) by benchmarks/refresh_placebo.py.
REFRESH_ALPHA = 0.05  # per refresh cycle, shared by the three rules
NOISE_WINDOW = 16  # successive differences of acceptance the step noise is estimated from (the newest)


def look_alpha(alpha: float, look: int) -> float:
    """The share of `alpha` the `look`-th look (1-based) spends: alpha / (look (look + 1)), summing to alpha."""
    return alpha / (look * (look + 1))


def step_noise(segments: list[list[float]], window: int = NOISE_WINDOW) -> tuple[float, float, float] | None:
    """One step's acceptance-length noise: (sd, degrees of freedom, rho), or None before two steps. `segments`: the
    acceptance per step of each stretch with one draft (a refresh starts a new one). Over the newest `window`
    successive differences d inside the segments (a slow trend, the policy moving, barely enters them; a refresh's
    jump not at all):
    - sd: von Neumann's sqrt(sum d^2 / (2 m)) over the m differences; with steps correlated at lag 1 (rho) it
      estimates sd_step * sqrt(1 - rho), which fit_line undoes;
    - df: 2 m^2 / (3 m - 1), the chi-square df whose variance the estimator has for independent steps (about 2/3
      of m, not m), scaled by (1 - rho) / (1 + rho) (correlated steps carry less information);
    - rho: the steps' lag-1 autocorrelation from the differences' own, about their mean (for an AR(1) series
      corr(d_t, d_(t-1)) = -(1 - rho) / 2, so rho = 1 + 2 corr; a steady trend moves only the mean), clipped to
      [0, RHO_MAX]: positive correlation is what widens a slope's
      spread and shrinks the differences; the recorded frozen runs showed 0.29-0.37 raw, 0.15-0.21 detrended."""
    diffs = [[b - a for a, b in zip(seg, seg[1:])] for seg in segments]
    newest = [d for seg in diffs for d in seg][-window:]
    if not newest:
        return None
    m = len(newest)
    sd = math.sqrt(sum(d * d for d in newest) / (2 * m))
    pairs, kept = [], m  # lag-1 pairs of differences inside a segment, among the newest `window`
    for seg in reversed(diffs):
        tail = seg[-kept:] if kept else []
        pairs += list(zip(tail, tail[1:]))
        kept -= len(tail)
    rho, mean = 0.0, sum(newest) / m  # the differences' mean: a steady trend's step, not noise
    var = sum((d - mean) ** 2 for d in newest) / m
    if pairs and var > 0:
        corr = sum((x - mean) * (y - mean) for x, y in pairs) / len(pairs) / var
        rho = min(max(1 + 2 * corr, 0.0), RHO_MAX)
    df = 2 * m * m / (3 * m - 1) * (1 - rho) / (1 + rho)
    return sd, max(math.floor(df * 4) / 4, 0.25), rho  # df down to a quarter: fewer t quantiles to compute (cached)


RHO_MAX = 0.9  # the largest lag-1 correlation read from a window's differences (beyond it a slope is mostly noise)


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
    se: float  # the slope's standard error, from one step's noise and the steps' lag-1 correlation


def fit_line(levels: list[float], sd: float, rho: float = 0.0) -> Line:
    """The least-squares line through `levels` at x = 0, 1, ...; the slope's standard error with steps correlated
    at lag 1 as an AR(1) series (rho; 0: independent steps, sd / sqrt(Sxx)): Var(slope) = sd_step^2 c'Rc / Sxx^2,
    c = x - mean(x), R_ij = rho^|i - j|, sd_step^2 = sd^2 / (1 - rho) (`sd`: von Neumann's, step_noise)."""
    n = len(levels)
    mx, my = (n - 1) / 2, sum(levels) / n
    c = [x - mx for x in range(n)]
    sxx = sum(x * x for x in c)
    slope = sum(x * y for x, y in zip(c, levels)) / sxx
    crc, lag = sxx, 1
    while rho > 0 and lag < n and rho**lag > 1e-9:  # c'Rc = Sxx + 2 sum over lags of rho^lag sum_i c_i c_(i + lag)
        crc += 2 * rho**lag * sum(c[i] * c[i + lag] for i in range(n - lag))
        lag += 1
    return Line(my - slope * mx, slope, sd * math.sqrt(crc / (1 - rho)) / sxx)


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
