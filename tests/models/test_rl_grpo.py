"""GRPO objective: Dr. GRPO advantages, token-level ratio masking, KL term, mismatch KL."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.rl.grpo import RATIO_HIGH, RATIO_LOW, group_advantages, grpo_loss, mismatch_kl  # noqa: E402


def test_advantages_are_reward_minus_group_mean_without_std_division() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 0.0])
    assert adv == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # scaling rewards scales advantages (a std division would undo it)
    assert group_advantages([10.0, 0.0, 0.0, 0.0]) == pytest.approx([7.5, -2.5, -2.5, -2.5])


def test_a_group_with_equal_rewards_has_no_signal() -> None:
    assert group_advantages([0.2] * 8) is None
    with pytest.raises(ValueError):
        group_advantages([])


def test_gradient_raises_the_better_completion_and_lowers_the_worse() -> None:
    logits = torch.zeros(2, 3, requires_grad=True)  # two completions of 3 tokens, logp = logits
    behaviour = [torch.zeros(3), torch.zeros(3)]
    loss, stats = grpo_loss([logits[0], logits[1]], behaviour, [1.0, -1.0], max_tokens=4)
    loss.backward()
    assert stats.tokens == 6 and stats.masked == 0 and stats.mean_ratio == pytest.approx(1.0)
    assert logits.grad is not None
    assert (logits.grad[0] < 0).all() and (logits.grad[1] > 0).all()  # descent raises row 0
    # the constant Dr. GRPO normalizer: G * max_tokens, whatever the lengths
    assert logits.grad[0, 0].item() == pytest.approx(-1.0 / (2 * 4))


def test_tokens_whose_ratio_leaves_the_bounds_are_masked() -> None:
    lp = torch.zeros(4, requires_grad=True)
    far = [math.log(RATIO_HIGH) + 0.1, -(math.log(1 / RATIO_LOW) + 0.1), 0.0, 0.0]
    behaviour = [torch.tensor([-far[0], -far[1], 0.0, 0.0])]  # ratios e^{far}: 2 out of bounds
    loss, stats = grpo_loss([lp], behaviour, [1.0], max_tokens=4)
    loss.backward()
    assert stats.masked == 2
    assert lp.grad is not None
    assert lp.grad[:2].abs().sum() == 0 and (lp.grad[2:] != 0).all()


def test_kl_to_base_is_zero_at_the_base_and_positive_away_from_it() -> None:
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    _, at_base = grpo_loss([lp], [lp.detach()], [0.5], max_tokens=2, base=[lp.detach()], kl_coef=0.1)
    assert at_base.kl == pytest.approx(0.0)
    _, away = grpo_loss([lp], [lp.detach()], [0.5], max_tokens=2,
                        base=[torch.tensor([-1.5, -1.0])], kl_coef=0.1)
    assert away.kl > 0
    with pytest.raises(ValueError, match="base"):
        grpo_loss([lp], [lp.detach()], [0.5], max_tokens=2, kl_coef=0.1)


def test_mismatched_shapes_are_an_error() -> None:
    with pytest.raises(ValueError, match="completion 0"):
        grpo_loss([torch.zeros(3)], [torch.zeros(2)], [1.0], max_tokens=3)
    with pytest.raises(ValueError):
        grpo_loss([torch.zeros(3)], [torch.zeros(3)], [1.0, 2.0], max_tokens=3)


def test_mismatch_kl_is_zero_for_equal_logprobs_and_grows_with_the_gap() -> None:
    assert mismatch_kl([-1.0, -2.0], [-1.0, -2.0]) == 0.0
    small = mismatch_kl([-1.0, -2.0], [-1.05, -1.95])
    large = mismatch_kl([-1.0, -2.0], [-3.0, -0.5])
    assert 0 < small < 0.01 < large
    with pytest.raises(ValueError):
        mismatch_kl([-1.0], [])
