"""rlhf_helpers: the tested reference code behind the RLHF-with-PPO course.

The package root re-exports the maths core (masked ops, log-probs, GAE, losses, KL). The re-exports
are lazy (PEP 562): `import rlhf_helpers.runtime.profiles` or `rlhf_helpers.runtime.data` stays free
of torch, and torch is imported on the first access such as `rlhf_helpers.compute_gae` or
`from rlhf_helpers import compute_gae`. Heavier parts live in submodules: `rlhf_helpers.world`,
`rlhf_helpers.ppo`, `rlhf_helpers.doctor`, `rlhf_helpers.widgets`, ...

A module that moved keeps its old import path for now (`_moved.MOVED`: `rlhf_helpers.ppo.diagnosis`
is `rlhf_helpers.doctor`); nothing moved is imported until its old name is.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rlhf_helpers import _moved

__version__ = "0.1.0"
_moved.install()

#: public name -> submodule defining it
_EXPORTS = {
    "validation": "core.checks",
    "masked_sum": "core.masked",
    "masked_mean": "core.masked",
    "masked_var": "core.masked",
    "masked_whiten": "core.masked",
    "logprobs_from_logits": "core.logprobs",
    "entropy_from_logits": "core.logprobs",
    "td_errors": "core.gae",
    "compute_gae": "core.gae",
    "gae_reference": "core.gae",
    "clipped_surrogate": "core.losses",
    "policy_loss": "core.losses",
    "kl_penalty_policy_loss": "core.losses",
    "value_loss": "core.losses",
    "lm_loss": "core.losses",
    "reward_model_loss": "core.losses",
    "pairwise_accuracy": "core.losses",
    "kl_estimate": "core.kl",
    "last_token_index": "core.tokens",
    "shape_rewards": "core.kl",
    "FixedKLController": "core.kl",
    "AdaptiveKLController": "core.kl",
    "rloo_advantages": "core.group_advantages",
    "grpo_advantages": "core.group_advantages",
}

__all__ = [  # the same names as _EXPORTS (a literal, so linters see them)
    "AdaptiveKLController",
    "FixedKLController",
    "clipped_surrogate",
    "compute_gae",
    "entropy_from_logits",
    "gae_reference",
    "grpo_advantages",
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
    "rloo_advantages",
    "shape_rewards",
    "td_errors",
    "validation",
    "value_loss",
]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlhf_helpers' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlhf_helpers.{module}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for editors and type checkers: the same names, imported eagerly
    from rlhf_helpers.core.checks import validation
    from rlhf_helpers.core.gae import compute_gae, gae_reference, td_errors
    from rlhf_helpers.core.kl import (
        AdaptiveKLController,
        FixedKLController,
        kl_estimate,
        shape_rewards,
    )
    from rlhf_helpers.core.logprobs import entropy_from_logits, logprobs_from_logits
    from rlhf_helpers.core.losses import (
        clipped_surrogate,
        kl_penalty_policy_loss,
        lm_loss,
        pairwise_accuracy,
        policy_loss,
        reward_model_loss,
        value_loss,
    )
    from rlhf_helpers.core.masked import masked_mean, masked_sum, masked_var, masked_whiten
    from rlhf_helpers.core.tokens import last_token_index
