"""The cost model's fit and the forecast's arithmetic on hand-made numbers."""

from __future__ import annotations

import pytest

from spectool.costmodel import (
    CostModel,
    acceptance_length,
    batch_rollout,
    fit,
    output_lengths,
    rates_from_length,
    rl_step_speedup,
)


def _rows(m: CostModel, rates, ks=(0, 1, 3), batches=(1, 8, 32), context=200.0):
    return [{"k": k, "batch": b, "mean_context": context,
             "mean_acceptance_length": acceptance_length(rates, k) if k else None,
             "tokens_per_s": b * acceptance_length(rates, k) / m.step_time(k, b, context)} for k in ks for b in batches]


def test_fit_recovers_a_known_model_and_says_context_was_not_varied():
    true = CostModel(a0=0.02, a1=0.001, a2=0.0, a3=0.003, a4=0.0002, context=200.0)
    m = fit(_rows(true, [0.8, 0.6, 0.4]))
    for k, b in [(0, 1), (2, 16), (3, 64), (5, 8)]:
        assert m.step_time(k, b) == pytest.approx(true.step_time(k, b), rel=1e-6)
    assert m.rel_rmse < 1e-9 and not m.context_fitted and "folded" in m.notes[0]


def test_fit_uses_context_when_it_varies_and_keeps_coefficients_non_negative():
    true = CostModel(a0=0.01, a1=0.0005, a2=2e-6, a3=0.002, a4=0.0001)
    rows = _rows(true, [0.7, 0.5, 0.3], context=100.0) + _rows(true, [0.7, 0.5, 0.3], context=900.0)
    m = fit(rows)
    assert m.context_fitted and m.a2 == pytest.approx(2e-6, rel=1e-4)
    noisy = [{**r, "tokens_per_s": r["tokens_per_s"] * (1.05 if i % 2 else 0.95)} for i, r in enumerate(rows)]
    m2 = fit(noisy)
    assert min(m2.a0, m2.a1, m2.a2, m2.a3, m2.a4) >= 0 and 0.03 < m2.rel_rmse < 0.08


def test_acceptance_arithmetic():
    assert acceptance_length([0.8, 0.6, 0.4], 3) == pytest.approx(2.8)
    assert acceptance_length([0.8, 0.4], 3) == pytest.approx(1 + 0.8 + 0.4 + 0.2)  # geometric beyond the rates
    rates = rates_from_length(3.32, 3)  # NeMo RL's acceptance at k=3
    assert acceptance_length(rates, 3) == pytest.approx(3.32, abs=1e-9)
    assert rates[1] / rates[0] == pytest.approx(rates[0]) and rates[0] == pytest.approx(0.8769, abs=1e-3)
    m = CostModel(a0=0.03, a1=0.0, a2=0.0, a3=0.003, a4=0.0)  # memory-bound target, draft 10% of it per pass
    assert m.speedup(3, 1, [0.8, 0.6, 0.4]) == pytest.approx(2.8 * 0.03 / (0.03 + 3 * 0.003))
    assert m.best_k(1, [0.8, 0.6, 0.4], [1, 2, 3]) == (3, pytest.approx(2.8 * 0.03 / 0.039))
    assert m.best_k(1, [0.0, 0.0, 0.0], [1, 2, 3], min_gain=0.03) == (0, 1.0)


def test_batch_rollout_counts_steps_and_shrinks_into_the_tail():
    m = CostModel(a0=1.0, a1=0.0, a2=0.0, a3=0.0, a4=0.0)  # every step costs 1 s
    plain = batch_rollout(m, [10, 4, 4], [0.5], lambda b: 0, prompt_len=0, max_concurrency=8)
    assert plain["seconds"] == 10 and plain["trace"][0] == (3, 0) and plain["trace"][-1] == (1, 0)
    spec = batch_rollout(m, [10, 4, 4], [1.0], lambda b: 1, prompt_len=0, max_concurrency=8)  # 2 tokens per step
    assert spec["seconds"] == 5
    capped = batch_rollout(m, [2, 2, 2, 2], [0.5], lambda b: 0, prompt_len=0, max_concurrency=2)
    assert capped["seconds"] == 4 and [b for b, _ in capped["trace"]] == [2, 2, 2, 2]


def test_rl_step_speedup_sync_and_async():
    r = rl_step_speedup(1.77, 0.66)  # NeMo RL's rollout speedup and generation share: they measured 1.41x
    assert r["sync"] == pytest.approx(1 / (0.34 + 0.66 / 1.77)) and r["sync"] == pytest.approx(1.40, abs=0.01)
    assert r["async_vs_sync_plain"] == pytest.approx(1 / max(0.66 / 1.77, 0.34))
    assert r["async_vs_async_plain"] == pytest.approx(0.66 / max(0.66 / 1.77, 0.34))


def test_output_length_shapes():
    assert output_lengths("fixed", 3, 50) == [50, 50, 50]
    lt = output_lengths("long-tail", 2000, 1024, seed=1)
    assert max(lt) == 1024 and min(lt) >= 1 and sorted(lt)[1000] < 400  # median ~ max/4, a few at the cap
