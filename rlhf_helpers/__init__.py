"""rlhf_helpers: the tested reference code behind the RLHF-with-PPO course.

The package root re-exports the maths core (torch only, imports fast). Heavier parts live in
submodules: `rlhf_helpers.world`, `rlhf_helpers.ppo`, `rlhf_helpers.widgets`, ...
"""

__version__ = "0.1.0"

from rlhf_helpers._checks import validation
from rlhf_helpers.gae import compute_gae, gae_reference, td_errors
from rlhf_helpers.kl import (
    AdaptiveKLController,
    FixedKLController,
    kl_estimate,
    last_token_index,
    shape_rewards,
)
from rlhf_helpers.logprobs import entropy_from_logits, logprobs_from_logits
from rlhf_helpers.losses import (
    clipped_surrogate,
    kl_penalty_policy_loss,
    lm_loss,
    pairwise_accuracy,
    policy_loss,
    reward_model_loss,
    value_loss,
)
from rlhf_helpers.masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "clipped_surrogate",
    "compute_gae",
    "entropy_from_logits",
    "gae_reference",
    "kl_estimate",
    "kl_penalty_policy_loss",
    "last_token_index",
    "lm_loss",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "pairwise_accuracy",
    "policy_loss",
    "reward_model_loss",
    "shape_rewards",
    "td_errors",
    "validation",
    "value_loss",
]
