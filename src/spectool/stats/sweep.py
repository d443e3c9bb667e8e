"""sweep-k's decision: is an arm faster than plain decoding, beyond the noise between engine runs?"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spectool.stats.distributions import normal_cdf, student_t_quantile

# --- sweep-k: an arm against plain decoding, beyond the noise between engine runs -----------------
# Design (sweep-k): `repeats` rounds; each round runs plain decoding and every arm in a fresh engine, one after the
# other (the order reversed every other round), all on the same prompts and seeds by wave. Per batch size and round,
# every engine's rate is taken over the waves all of them decoded (paired by wave). Log rates follow a block design:
# y[a][r] = mu_a + rho_r + e[a][r] (rho_r: the machine during round r, shared by its engines; e[a][r]: one engine
# run's own noise, which holds the noise between waves too). The machine cancels in each paired difference d[r] =
# y[a][r] - y[plain][r]; an arm's log speedup is their mean over rounds, with the standard error of that arm's own
# differences, sd(d) / sqrt(R) on R - 1 degrees of freedom (Student's t: the paired t). The assumption: the rounds'
# e are independent and normal, each engine with its own variance (engines are not equally noisy: a draft's runs
# varied 40.6% against plain decoding's 10.6% at batch 4 on this CPU beside other jobs, docs/results.md; one
# residual mean square pooled over the arms x rounds table gives every arm the average noise, too little for a noisy
# plain engine or arm). Its lower bound counts every arm compared at that batch size (Bonferroni: one-sided level
# alpha / arms), so the chance that any arm is recommended when none is faster is at most alpha per batch size,
# whatever the arms' noise and however they correlate through plain decoding. One round measures no noise between
# runs, and differences identical in every round (a standard error of 0) measure none either: neither gets a bound,
# so neither recommends anything.
# What breaks the bound: not unequal variance (each arm's own differences carry it) but noise that is not normal. Skew
# above all: contention only ever slows a run (usually fast, now and then much slower), and with 2-4 rounds a sweep
# rarely samples the slow tail, so sd(d) is understated when it does not and the mean is pulled when it does. Runs
# slowed that way (log rate s - Exp(mean s), arms 15% against plain 2%) gave 12-28% false recommendations at
# --min-gain 0 (audit-2026-11c M3; benchmarks/sweep_calibration.py simulate has the cells). Hence sweep-k records the
# CPU other processes took per engine run and says when it mattered (spectool.machine_load): the bound is not held then.

SWEEP_ALPHA = 0.05  # the recommendation's false-alarm rate per batch size, every arm it looked at counted


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




def power(sd_d: float, rounds: int, arms: int, speedup: float = 1.3, min_gain: float = 0.03,
          alpha: float = SWEEP_ALPHA) -> float:
    """The chance that an arm truly `speedup` times as fast as plain decoding gets a lower bound (block_speedups)
    that clears 1 + min_gain, when its paired log differences have sd `sd_d` a round (normal noise), in a sweep of
    `rounds` rounds and `arms` arms counted. The bound clears when (mean - c) / (sd_d / sqrt(R)) = Z + delta exceeds
    q * t, t = sd(d) / sd_d: delta = (log speedup - c) / (sd_d / sqrt(R)), c = log(1 + min_gain), q the t quantile;
    t has the density of sqrt(chi2_df / df), so the power is the integral of Phi(delta - q t) over it (Simpson's
    rule). nan with one round (no bound)."""
    df = rounds - 1
    if df < 1 or not sd_d > 0:
        return float("nan")
    delta = (math.log(speedup) - math.log(1 + min_gain)) / (sd_d / math.sqrt(rounds))
    q = student_t_quantile(1.0 - alpha / arms, rounds - 1)
    # density of t = sqrt(chi2_df / df): 2 (df/2)^(df/2) t^(df-1) exp(-df t^2 / 2) / Gamma(df/2)
    log_c = math.log(2) + df / 2 * math.log(df / 2) - math.lgamma(df / 2)
    steps, top = 4000, 1 + 12 / math.sqrt(df)  # the density is negligible beyond
    h = top / steps
    total = 0.0
    for i in range(steps + 1):
        t = i * h
        dens = math.exp(log_c + (df - 1) * math.log(t) - df * t * t / 2) if t > 0 else (math.exp(log_c) if df == 1 else 0.0)
        total += (1 if i in (0, steps) else 4 if i % 2 else 2) * dens * normal_cdf(delta - q * t)
    return min(1.0, total * h / 3)
