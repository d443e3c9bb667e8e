"""verify's tests: is speculative sampling exactly the policy's sampling? (docs/lossless.md)

Per arm (plain decoding, speculative decoding, a lossy control), every sampled token is scored under the
policy's own distribution p (token_terms):
1. A likelihood-ratio test against lossy samplers made from p itself (ALTERNATIVES: wrong temperatures,
   truncations), mixed over the alternatives (mixture_p), beside the score log p(x) + H(p), whose mean is 0
   under exact sampling (ScoreTest: descriptive).
2. Token-distribution tests: for one prompt and one position the sampled token has the same marginal with and
   without speculation iff sampling is lossless (a necessary condition): chi-square homogeneity on the two count
   vectors (sparse cells merged), a permutation p-value where the law's tail is too thin, resolved sequentially
   against the level it is read at.
All tests of one verdict share a Bonferroni-corrected family-wise level (commands/verify.py).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from spectool.stats.distributions import binomial_bound, binomial_cdf, chi2_sf, normal_cdf, normal_two_sided_p

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


RESOLUTION = 0.01  # the resampling risk, as a share of the level a token test's permutation p-value is read at;
# at verify's cap (200 / level relabellings) an exact p within about 0.8x-1x of the level is rarely resolved below
# it (0.81x: 6 of 300 runs, 0.60x: 266 of 300; docs/lossless.md): a loss of power there, not of the level
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

