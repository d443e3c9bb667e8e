"""The laws the tests and decisions share: normal, chi-square, Student's t, binomial (Clopper-Pearson)."""

from __future__ import annotations

import functools
import math


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

