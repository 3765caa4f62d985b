"""Advantages without a critic: a group of G responses per prompt is its own baseline.

PPO learns a value function V(s_t) and spreads one sequence score over the tokens with GAE. RLOO
and GRPO drop the critic: they sample G responses to the same prompt and compare each response's
scalar reward with its siblings'. Every token of response i then gets the same advantage A_i.

Conventions (rewards: (N, G), one row per prompt, one column per response to it):
- RLOO (Ahmadian et al. 2024, "Back to Basics", eq. 5): the baseline of response i is the mean of
  the other G - 1 rewards of its group.
- GRPO (Shao et al. 2024, DeepSeekMath, section 4.1.2): the reward minus the group mean, divided by
  a standard deviation. Which one is `scale`: "group" (the group's own std, GRPO as published),
  "batch" (one std over every reward of the batch) or "none" (no division: Dr. GRPO, Liu et al.
  2025, who show that dividing by a group's std up-weights prompts whose rewards barely differ).
  The std is the sample std (n - 1 in the denominator); `eps` (1e-4) is added to it, as in TRL.
Both equal TRL 1.16's `RLOOTrainer` and `GRPOTrainer` advantages for one reward function and no
missing rewards (the course's tests check this against the trainers' own logs).
"""

from __future__ import annotations

import numbers

import torch

from rlhf_helpers.core.advantage_estimators import advantage_estimator
from rlhf_helpers.core.checks import (
    check_finite,
    check_floating,
    check_ndim,
    check_nonempty,
    check_positive,
)

#: How GRPO divides the centred rewards (see the module docstring).
GRPO_SCALES = ("group", "batch", "none")
#: Added to the std before dividing (TRL's value): a group of equal rewards gets A = 0, not 0/0.
GRPO_EPS = 1e-4


def _check_group_rewards(rewards: torch.Tensor) -> None:
    check_ndim("rewards", rewards, 2, "(N prompts, G responses per prompt)")
    check_nonempty("rewards", rewards)
    check_floating("rewards", rewards)
    check_finite("rewards", rewards)
    if rewards.shape[1] < 2:
        raise ValueError("rewards must have G >= 2 responses per prompt (a group needs siblings "
                         f"to compare with), got shape {tuple(rewards.shape)}")


def _without_overflow(advantages, rewards: torch.Tensor, name: str) -> torch.Tensor:
    """advantages(r, unit) of rewards = r * unit, computed as given (unit 1); only when a sum or a
    square overflowed on rewards near the float limit (1e38 in float32), again on rewards / max|r|,
    so that ordinary rewards keep their exact rounding. An answer that itself exceeds the float
    range is refused rather than returned as inf."""
    result = advantages(rewards, 1.0)  # (N, G)
    if bool(torch.isfinite(result).all()):
        return result
    unit = float(rewards.abs().max())
    result = advantages(rewards / unit, unit)  # (N, G)
    if not bool(torch.isfinite(result).all()):
        raise ValueError(f"{name}: the advantages of rewards as large as {unit:.3g} exceed the "
                         f"range of {rewards.dtype}; scale the rewards down")
    return result


def group_rewards(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Flat (N * G,) rewards -> (N, G), grouped as the trainers sample them (G in a row each)."""
    check_ndim("rewards", rewards, 1, "(N * G,)")
    check_nonempty("rewards", rewards)
    integral = isinstance(group_size, numbers.Integral) and not isinstance(group_size, bool)
    if not integral or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2, got {group_size!r}")
    group_size = int(group_size)  # numpy's integers too
    if rewards.numel() % group_size:
        raise ValueError(
            f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}")
    return rewards.view(-1, group_size)  # (N, G)


@advantage_estimator("rloo")
def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out advantages: (N, G) rewards -> (N, G) advantages.

    A_i = r_i - 1/(G-1) sum_{j != i} r_j  =  G/(G-1) (r_i - mean_j r_j)
    """
    _check_group_rewards(rewards)
    G = rewards.shape[1]

    def leave_one_out(r: torch.Tensor) -> torch.Tensor:
        others_mean = (r.sum(dim=1, keepdim=True) - r) / (G - 1)  # (N, G) baseline of each response
        return r - others_mean  # (N, G)

    # linear in r: rewards near the float limit are scaled down only when the sum would overflow
    return _without_overflow(lambda r, scale: leave_one_out(r) * scale, rewards, "rloo_advantages")


@advantage_estimator("grpo")
def grpo_advantages(rewards: torch.Tensor, scale: str = "group",
                    eps: float = GRPO_EPS) -> torch.Tensor:
    """GRPO's group-normalised advantages: (N, G) rewards -> (N, G) advantages.

    A_i = (r_i - mean(r_group)) / (std + eps), std by `scale`: "group" (the group's sample std),
    "batch" (the sample std of all N * G rewards), "none" (no division, Dr. GRPO).
    """
    _check_group_rewards(rewards)
    if scale not in GRPO_SCALES:
        raise ValueError(f"scale must be one of {GRPO_SCALES}, got {scale!r}")
    check_positive("eps", eps)

    def normalised(r: torch.Tensor, unit: float) -> torch.Tensor:
        """Of r = rewards / unit: c*unit / (std*unit + eps) = c / (std + eps/unit), eps scaled."""
        centred = r - r.mean(dim=1, keepdim=True)  # (N, G)
        if scale == "none":
            return centred * unit
        std = r.std(dim=1, keepdim=True) if scale == "group" else r.std()  # (N, 1) or ()
        return centred / (std + eps / unit)  # (N, G)

    return _without_overflow(normalised, rewards, "grpo_advantages")
