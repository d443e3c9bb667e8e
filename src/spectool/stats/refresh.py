"""The `auto` refresh's ledger: did a refresh raise acceptance, and what has a stale draft cost?"""

from __future__ import annotations

import math
from dataclasses import dataclass

# --- the auto refresh: a refresh's gain, against the previous draft on the same rollouts ------------
# The auto refresh (draft/refresh_policy.py) decides after every RL step whether to retrain its draft, on one batch's
# acceptance a step: a noisy measurement whose noise the decisions below carry. Each rule fires only when its ledger
# clears the refresh's cost at a one-sided lower confidence bound, and the looks at one refresh cycle spend a
# false-refresh budget `alpha` (alpha / (m (m + 1)) at the m-th step since the refresh: the sum over any number of
# steps stays below alpha; a union bound). So a draft whose acceptance is only noise, or a refresh that bought
# nothing, triggers another refresh with probability at most alpha per cycle. The assumption: one step's acceptance
# noise is normal and stationary, independent between steps or correlated as an AR(1) series whose lag-1 correlation
# the run's own steps estimate (step_noise; the slope's se and df carry it); measured with independent and AR(1)
# steps (rho 0.3, 0.6, 0.8) by benchmarks/refresh_placebo.py.
REFRESH_ALPHA = 0.05  # per refresh cycle, shared by the three rules
NOISE_WINDOW = 64  # successive differences of acceptance the step noise is estimated from (the newest)
MIN_LEVELS = 8  # the fewest steps whose levels the lag-1 correlation is also read from (fewer: the differences only)


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
    - rho: the steps' lag-1 autocorrelation, the larger of two readings, clipped to [0, RHO_MAX] (positive
      correlation is what widens a slope's spread and shrinks the differences):
      - from the differences' own, about their mean (for an AR(1) series corr(d_t, d_(t-1)) = -(1 - rho) / 2, so
        rho = 1 + 2 corr; a steady trend moves only the mean). Nearly unbiased but wide: at rho 0.8 corr is -0.1
        against -0.4 at rho 0.2, and 16 differences cannot tell them apart (sd of the reading about 0.45);
      - from the same steps' levels about each segment's least-squares line (levels_rho), once there are MIN_LEVELS:
        narrower (sd about 0.1 at 64 steps), biased low by about (2 + 4 rho) / n and corrected for it.
      The slope's se grows like (1 + rho) / (1 - rho)^2 in rho, so a reading that falls low by chance, at one of a
      cycle's many looks, is what fires a false refresh (audit-2026-11c M4: 10% of frozen runs at rho 0.8 with the
      differences' reading alone, 16 of them);
    - df: von_neumann_df(m, rho), the chi-square df of von Neumann's estimator under AR(1) steps (more than for
      independent steps: the differences of correlated steps are less correlated with each other).
    The recorded frozen runs showed rho 0.29-0.37 raw, 0.15-0.21 detrended (the differences' reading)."""
    diffs = [[b - a for a, b in zip(seg, seg[1:])] for seg in segments]
    newest = [d for seg in diffs for d in seg][-window:]
    if not newest:
        return None
    m = len(newest)
    sd = math.sqrt(sum(d * d for d in newest) / (2 * m))
    pairs, tails, kept = [], [], m  # lag-1 pairs of differences inside a segment, among the newest `window`
    for seg, levels in zip(reversed(diffs), reversed(segments)):
        tail = seg[-kept:] if kept else []
        pairs += list(zip(tail, tail[1:]))
        tails.append(levels[-len(tail) - 1:] if tail else [])
        kept -= len(tail)
    rho, mean = 0.0, sum(newest) / m  # the differences' mean: a steady trend's step, not noise
    var = sum((d - mean) ** 2 for d in newest) / m
    if pairs and var > 0:
        rho = 1 + 2 * sum((x - mean) * (y - mean) for x, y in pairs) / len(pairs) / var
    from_levels = levels_rho(tails)
    if from_levels is not None:
        rho = max(rho, from_levels)
    rho = min(max(rho, 0.0), RHO_MAX)
    return sd, max(math.floor(von_neumann_df(m, rho) * 4) / 4, 0.25), rho  # df in quarters: fewer t quantiles (cached)


def levels_rho(segments: list[list[float]]) -> float | None:
    """The steps' lag-1 autocorrelation from their levels about each segment's least-squares line (a trend, the
    policy moving or a draft going stale, taken out), pooled over segments of 4 steps or more: r = sum e_t e_(t-1) /
    sum e_t^2 over the n levels, bias-corrected to r + (2 + 4 r) / n (the lag-1 estimate about a mean is low by
    about (1 + 3 rho) / n, Marriott and Pope 1954; a fitted line takes about one more (1 + rho) / n). None below
    MIN_LEVELS levels."""
    num = den = 0.0
    n = 0
    for seg in segments:
        k = len(seg)
        if k < 4:
            continue
        mx, my = (k - 1) / 2, sum(seg) / k
        c = [x - mx for x in range(k)]
        b = sum(x * y for x, y in zip(c, seg)) / sum(x * x for x in c)
        e = [y - my - b * x for x, y in zip(c, seg)]
        num += sum(u * v for u, v in zip(e, e[1:]))
        den += sum(u * u for u in e)
        n += k
    if n < MIN_LEVELS or den <= 0:
        return None
    r = num / den
    return r + (2 + 4 * r) / n


def von_neumann_df(m: int, rho: float) -> float:
    """The chi-square df 2 E[S]^2 / Var S of von Neumann's S = sum d^2 / (2 m) over m successive differences of
    an AR(1) series at lag-1 correlation rho (normal steps): corr(d_t, d_(t+k)) = -rho^(k-1) (1 - rho) / 2, so
    df = m^2 / (m + (1 - rho)^2 / 2 * sum_(k=1)^(m-1) (m - k) rho^(2 (k-1))): 2 m^2 / (3 m - 1) for independent
    steps, 2 m / (2 + (1 - rho) / (1 + rho)) for large m (von Neumann 1941)."""
    spread = sum((m - k) * rho ** (2 * (k - 1)) for k in range(1, m))
    return m * m / (m + (1 - rho) ** 2 / 2 * spread)


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
        # sum_i c_i c_(i + lag) over the k = n - lag pairs, c_i = i - mx, is sum c_i^2 + lag sum c_i over i < k: in
        # closed form (a loop over i made fit_line O(n^2) at rho 0.8, most of a simulated 64-step run's time)
        k = n - lag
        sum_cc = (k - 1) * k * (2 * k - 1) / 6 - mx * k * (k - 1) + k * mx * mx + lag * (k * (k - 1) / 2 - k * mx)
        crc += 2 * rho**lag * sum_cc
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

