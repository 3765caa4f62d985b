"""RLOO and GRPO advantages against loop references, known limits and bad input.

Tolerances: every check compares float64 results of a few additions and one division (no
accumulation over long sums), so 1e-12 is far above their rounding on any CPU.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlhf_helpers.core.group_advantages import (
    GRPO_EPS,
    group_rewards,
    grpo_advantages,
    rloo_advantages,
)

TOL = {"atol": 1e-12, "rtol": 1e-12}


def _rloo_loop(rows: list[list[float]]) -> list[list[float]]:
    """A_i = r_i - mean of the other rewards of the group, one number at a time."""
    out = []
    for row in rows:
        out.append([r - sum(row[j] for j in range(len(row)) if j != i) / (len(row) - 1)
                    for i, r in enumerate(row)])
    return out


def _grpo_loop(rows: list[list[float]], scale: str, eps: float = GRPO_EPS) -> list[list[float]]:
    """(r_i - group mean) / (std + eps) with statistics.stdev (the n - 1 sample std)."""
    flat = [r for row in rows for r in row]
    out = []
    for row in rows:
        mean = sum(row) / len(row)
        std = statistics.stdev(row) if scale == "group" else statistics.stdev(flat)
        out.append([(r - mean) / (std + eps) if scale != "none" else r - mean for r in row])
    return out


@pytest.fixture
def rewards() -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64) * 2 + 1


def test_rloo_matches_the_loop(rewards):
    expected = torch.tensor(_rloo_loop(rewards.tolist()), dtype=torch.float64)
    torch.testing.assert_close(rloo_advantages(rewards), expected, **TOL)


def test_rloo_is_a_rescaled_centred_reward(rewards):
    # A_i = G/(G-1) (r_i - mean): the leave-one-out baseline only rescales the group-centred reward
    G = rewards.shape[1]
    torch.testing.assert_close(rloo_advantages(rewards),
                               G / (G - 1) * (rewards - rewards.mean(1, keepdim=True)), **TOL)


def test_rloo_with_two_responses_is_their_difference():
    r = torch.tensor([[3.0, 1.0], [-2.0, 5.0]], dtype=torch.float64)
    torch.testing.assert_close(rloo_advantages(r),
                               torch.tensor([[2.0, -2.0], [-7.0, 7.0]], dtype=torch.float64))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_matches_the_loop(rewards, scale):
    expected = torch.tensor(_grpo_loop(rewards.tolist(), scale), dtype=torch.float64)
    torch.testing.assert_close(grpo_advantages(rewards, scale=scale), expected, **TOL)


def test_every_group_advantage_sums_to_zero_per_group(rewards):
    for advantages in (rloo_advantages(rewards),
                       *(grpo_advantages(rewards, s) for s in ("group", "batch", "none"))):
        torch.testing.assert_close(advantages.sum(dim=1), torch.zeros(5, dtype=torch.float64),
                                   atol=1e-12, rtol=0)


def test_equal_rewards_give_zero_advantage_not_nan():
    r = torch.full((3, 4), 0.75, dtype=torch.float64)  # exact in binary: the mean is exactly 0.75
    for advantages in (rloo_advantages(r), grpo_advantages(r), grpo_advantages(r, "batch"),
                       grpo_advantages(r, "none")):
        assert torch.equal(advantages, torch.zeros_like(r))


def test_group_std_scaling_inflates_nearly_tied_groups():
    # Dr. GRPO's point: dividing by the group's own std makes a group whose rewards differ by 0.01
    # push as hard as one whose rewards differ by 10; without the division ("none") it does not.
    r = torch.tensor([[0.0, 0.01], [0.0, 10.0]], dtype=torch.float64)
    scaled = grpo_advantages(r, "group").abs().max(dim=1).values
    assert math.isclose(scaled[0], scaled[1], rel_tol=0.02)  # only eps tells them apart
    unscaled = grpo_advantages(r, "none").abs().max(dim=1).values
    assert math.isclose(unscaled[1] / unscaled[0], 1000.0, rel_tol=1e-9)


def test_grpo_group_scale_is_invariant_to_reward_scale(rewards):
    # up to eps: (c r - c mean) / (c std) = (r - mean) / std
    torch.testing.assert_close(grpo_advantages(rewards * 100.0, "group", eps=1e-12),
                               grpo_advantages(rewards, "group", eps=1e-12), atol=1e-9, rtol=1e-9)


def test_group_rewards_takes_groups_in_a_row():
    flat = torch.arange(6.0)
    assert group_rewards(flat, 3).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@pytest.mark.parametrize("bad, match", [
    (torch.randn(4), "shape"),
    (torch.randn(3, 1), "G >= 2"),
    (torch.zeros(0, 4), "empty"),
    (torch.tensor([[1, 2], [3, 4]]), "floating"),
    (torch.tensor([[1.0, float("nan")]]), "finite"),
])
def test_bad_rewards_are_refused(bad, match):
    for fn in (rloo_advantages, grpo_advantages):
        with pytest.raises(ValueError, match=match):
            fn(bad)


def test_bad_arguments_are_refused(rewards):
    with pytest.raises(ValueError, match="scale must be one of"):
        grpo_advantages(rewards, scale="std")
    with pytest.raises(ValueError, match="eps"):
        grpo_advantages(rewards, eps=0.0)
    with pytest.raises(ValueError, match="group_size"):
        group_rewards(torch.arange(6.0), 1)
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_rewards(torch.arange(7.0), 2)


def test_group_rewards_takes_numpy_sizes_and_refuses_an_empty_batch():
    import numpy as np

    from rlhf_helpers.core.group_advantages import group_rewards

    flat = torch.arange(6.0)
    assert torch.equal(group_rewards(flat, np.int64(3)), flat.view(2, 3))
    with pytest.raises(ValueError, match="rewards"):
        group_rewards(torch.zeros(0), 2)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_rewards_near_the_float32_limit_give_the_loop_answer_not_inf(rewards, scale):
    """float32 rewards of 1e38 overflow a group's sum (4e38 > 3.4e38): the advantages must still be
    the loop's (computed in Python floats, float64, where nothing overflows). Tolerance: the result
    is float32 (rounding 6e-8 relative) and the rescaled path adds a division and a multiplication
    by max|r|, each within one float32 rounding, so 1e-6 relative is well above it on any CPU."""
    big = (rewards / rewards.abs().max() * 1e38).float()  # (5, 4) within [-1e38, 1e38]
    big[0] = 1e38  # a tied group at the limit: advantages 0
    rows = big.double().tolist()
    for name, got, expected in (
            ("rloo", rloo_advantages(big), _rloo_loop(rows)),
            ("grpo", grpo_advantages(big, scale=scale), _grpo_loop(rows, scale))):
        expected = torch.tensor(expected, dtype=torch.float64)
        assert torch.isfinite(got).all(), name
        torch.testing.assert_close(got.double(), expected, rtol=1e-6,
                                   atol=1e-6 * expected.abs().max().item(), msg=name)
    assert (rloo_advantages(big)[0] == 0).all()


def test_ordinary_rewards_keep_their_exact_rounding(rewards):
    """The rescaled path runs only when the direct one overflowed: ordinary float32 rewards get the
    direct formula bit for bit (notebook 07's numbers do not move)."""
    r = rewards.float()
    G = r.shape[1]
    direct = r - (r.sum(dim=1, keepdim=True) - r) / (G - 1)  # (5, 4)
    assert torch.equal(rloo_advantages(r), direct)


def test_advantages_beyond_the_float_range_are_refused():
    with pytest.raises(ValueError, match=r"rloo_advantages: the advantages of rewards as large as "
                                         r"3e\+38 exceed"):
        rloo_advantages(torch.tensor([[3e38, -3e38]]))  # the true answer, +-6e38, is not a float32
