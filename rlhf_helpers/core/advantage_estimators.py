"""The advantage estimators, each with its metadata: the one list of their names.

    ADVANTAGE_ESTIMATORS["gae"].verl           # "gae": verl's algorithm.adv_estimator
    ADVANTAGE_ESTIMATORS["grpo"].openrlhf      # "group_norm": OpenRLHF's --algo.advantage.estimator
    ADVANTAGE_FUNCTIONS["rloo"]                # rloo_advantages, once core.group_advantages is in

The entries are declared here, free of torch, because the torch-free cluster export names them; the
maths that computes each one needs torch and lives in `core.gae` or `core.group_advantages`, where
`@advantage_estimator("gae")` on the function registers it under a declared name (a name not
declared here is refused when that module is imported). PPOTrainer runs GAE (`ppo_trainer`); the
group estimators are the comparison's (`compare`, through TRL's trainers). Adding one: an entry
here, its function decorated where it is written, and their tests (CONTRIBUTING.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rlhf_helpers.core.registry import Registry


@dataclass(frozen=True)
class AdvantageEstimator:
    """One advantage estimator: what it computes and where the frameworks call it what."""

    name: str  #: the name the course uses (and `advantage_estimator` registers the function under)
    formula: str  #: what it computes, in one line
    verl: str | None  #: verl's algorithm.adv_estimator name (None: verl has none)
    openrlhf: str | None  #: OpenRLHF's --algo.advantage.estimator choice (None: none)
    critic: bool  #: it needs a learned value function V(s_t)
    group: bool  #: it needs G > 1 responses per prompt (the group is its baseline)
    ppo_trainer: bool  #: PPOTrainer runs it (the others: the comparison's TRL trainers)


#: every advantage estimator by name
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage_estimator", "advantage estimator", "rlhf_helpers/core/advantage_estimators.py")
ADVANTAGE_ESTIMATORS.add(AdvantageEstimator(
    "gae", "A_t = sum_l (gamma lam)^l delta_(t+l), delta_t = r_t + gamma V(s_(t+1)) - V(s_t)",
    verl="gae", openrlhf="gae", critic=True, group=False, ppo_trainer=True))
ADVANTAGE_ESTIMATORS.add(AdvantageEstimator(
    "rloo", "A_i = R_i - the mean of the other G - 1 rewards of its group",
    verl="rloo", openrlhf="rloo", critic=False, group=True, ppo_trainer=False))
ADVANTAGE_ESTIMATORS.add(AdvantageEstimator(
    "grpo", "A_i = (R_i - the mean of its group) / (the group's std + eps)",
    verl="grpo", openrlhf="group_norm", critic=False, group=True, ppo_trainer=False))

#: name -> the function that computes it, registered by `advantage_estimator` where it is written
ADVANTAGE_FUNCTIONS: dict[str, Callable[..., Any]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def advantage_estimator(name: str) -> Callable[[F], F]:
    """Register the decorated function as the advantage estimator `name`, one declared in
    ADVANTAGE_ESTIMATORS (ValueError otherwise, or if it already has a function); the function is
    returned as it is."""
    ADVANTAGE_ESTIMATORS.check("advantage_estimator", name)

    def register(function: F) -> F:
        if ADVANTAGE_FUNCTIONS.get(name, function) is not function:
            raise ValueError(f"advantage estimator {name!r} already has a function: "
                             f"{ADVANTAGE_FUNCTIONS[name].__qualname__}")
        ADVANTAGE_FUNCTIONS[name] = function
        return function
    return register
