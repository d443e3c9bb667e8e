"""GRPO advantages and objective on hand-made numbers."""

import math

import pytest
import torch

from spectool.rl.grpo import group_advantages, grpo_loss


def test_group_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    a = group_advantages(r, eps=0.0 + 1e-12)
    assert a[0].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0])  # mean 0.5, std 0.5
    assert a[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # no signal in an all-equal group
    assert group_advantages(r, scale_by_std=False)[0].tolist() == [0.5, -0.5, -0.5, 0.5]


def test_on_policy_loss_is_minus_mean_advantage_and_its_gradient_is_the_policy_gradient():
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    out = grpo_loss(lp, lp.detach(), adv, mask)
    # ratio 1 everywhere: loss = -(2 + 2 - 1 - 1 - 1) / 5 tokens
    assert float(out.loss) == pytest.approx(-1 / 5)
    out.loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-2 / 5, -2 / 5, 0.0], [1 / 5, 1 / 5, 1 / 5]]))
    assert out.clip_fraction == 0.0


def test_clipping_by_hand():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    mask = torch.ones(1, 2)
    pos = grpo_loss(new, old, torch.tensor([1.0]), mask)
    # A > 0: token 1 clipped at 1.2; token 2 keeps 0.5 (min picks the unclipped, smaller value)
    assert float(pos.loss) == pytest.approx(-(1.2 + 0.5) / 2)
    assert pos.clip_fraction == pytest.approx(0.5)
    pos.loss.backward()
    assert new.grad[0, 0] == 0.0  # no gradient through the clipped token


def test_kl_penalty_k3_by_hand():
    new = torch.tensor([[0.0]])
    ref = torch.tensor([[math.log(2.0)]])
    out = grpo_loss(new, new, torch.tensor([0.0]), torch.ones(1, 1), beta=0.5, logp_ref=ref)
    assert out.kl == pytest.approx(2.0 - math.log(2.0) - 1)
    assert float(out.loss) == pytest.approx(0.5 * (2.0 - math.log(2.0) - 1))
    with pytest.raises(ValueError):
        grpo_loss(new, new, torch.tensor([0.0]), torch.ones(1, 1), beta=0.1)
