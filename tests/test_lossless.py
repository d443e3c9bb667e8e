"""The statistics behind `spectool verify`, on hand-built samples with known answers."""

import math
import random

import pytest
import torch

from spectool.stats import (
    chi2_homogeneity,
    chi2_sf,
    detectable_shift,
    detectable_tv,
    normal_quantile,
    score_test,
    token_test,
    welch,
)


def test_chi2_tail_matches_known_values():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    assert chi2_sf(9.487729036781154, 4) == pytest.approx(0.05, abs=1e-9)
    assert normal_quantile(0.975) == pytest.approx(1.959963984540054, abs=1e-9)


def test_chi2_homogeneity_by_hand():
    # 2 x 2 table [[10, 20], [30, 40]]: expected [[12, 18], [28, 42]]
    stat, df, p = chi2_homogeneity([(10, 30), (20, 40)])
    assert df == 1
    assert stat == pytest.approx(4 / 12 + 4 / 28 + 4 / 18 + 4 / 42)
    assert p == pytest.approx(chi2_sf(stat, 1))


def _draw(probs, n, rng):
    return rng.choices(range(len(probs)), weights=probs, k=n)


def test_token_test_accepts_equal_and_rejects_different_distributions():
    rng = random.Random(0)
    p = [0.5, 0.3, 0.15, 0.05]
    q = [0.4, 0.4, 0.15, 0.05]  # total variation 0.1
    same = [token_test(0, 1, _draw(p, 2000, rng), _draw(p, 2000, rng)).p for _ in range(40)]
    assert sum(x < 0.01 for x in same) <= 2  # ~1% false rejections expected
    diff = token_test(0, 1, _draw(p, 2000, rng), _draw(q, 2000, rng))
    assert diff.p < 1e-6
    assert diff.tv == pytest.approx(0.1, abs=0.03)


def test_rare_tokens_are_pooled_into_one_cell():
    t = token_test(0, 1, [1] * 50 + [7, 8], [1] * 50 + [9])
    assert t.cells == 2  # token 1, and {7, 8, 9} pooled
    assert sum(t.pooled) == pytest.approx(1.0)


def _scores(temperature_error: float, n: int, seed: int) -> list[float]:
    """log p(x) + H(p) for tokens drawn at temperature 1 + error from random distributions p."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 50, generator=g) * 2
    lp = torch.log_softmax(logits, -1)
    x = torch.multinomial(torch.softmax(logits / (1 + temperature_error), -1), 1, generator=g)[:, 0]
    return (lp.gather(-1, x[:, None])[:, 0] - (lp.exp() * lp).sum(-1)).tolist()


def test_score_test_is_centred_for_exact_sampling_and_flags_a_wrong_temperature():
    exact = score_test(_scores(0.0, 20000, 1))
    assert abs(exact.z) < 3.5
    hot = score_test(_scores(0.3, 20000, 2))
    assert hot.mean < 0 and hot.p < 1e-6
    d = welch(hot, exact)
    assert d.se == pytest.approx(math.hypot(hot.se, exact.se))
    assert d.p < 1e-6


def test_detectable_effects_shrink_with_more_samples():
    assert detectable_shift(0.01, 0.05) == pytest.approx((1.959964 + 0.841621) * 0.01, rel=1e-4)
    p = [0.6, 0.3, 0.1]
    small, large = detectable_tv(p, 200, 0.01, sims=60), detectable_tv(p, 2000, 0.01, sims=60)
    assert 0 < large < small < 0.6
    assert math.isnan(detectable_tv([1.0], 100, 0.01))
