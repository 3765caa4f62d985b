"""The settings every method of the comparison shares, and the few that are method-specific."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rlhf_helpers.runtime.config_fields import check_field_types
from rlhf_helpers.runtime.config_limits import (
    check_ints_from,
    check_non_negative,
    check_positive,
    check_seed,
    ints_from,
)
from rlhf_helpers.runtime.lora import LoRASpec, as_lora_spec
from rlhf_helpers.runtime.profile_fields import profile_field, profile_values

#: The trained methods of the comparison (best-of-n is the untrained baseline, `run_best_of_n`).
METHODS = ("ppo", "grpo", "rloo", "dpo")
#: TRL 1.16's GRPO loss aggregations the comparison accepts (GRPOConfig.loss_type).
GRPO_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo")
#: TRL 1.16's GRPO reward scalings the comparison accepts (GRPOConfig.scale_rewards).
GRPO_SCALE_REWARDS = ("group", "batch", "none")
#: The Profile fields `CompareConfig.from_profile` reads.
PROFILE_FIELDS = ("compare_seconds", "compare_batches", "ppo")
#: What best_of must be.
BEST_OF = "a non-empty tuple of ints >= 1"


@dataclass(frozen=True)
class CompareConfig:
    """One comparison: the same budget, prompts, reward, LoRA policy and judge for every method.

    The settings shared with PPO default to the tiny profile's (`profile_field`); `from_profile`
    reads them from any profile."""

    #: training budget of each method when train_batches is None: CPU seconds of this process on a
    #: CPU, wall seconds on a GPU (model building and evaluations excluded); how much each method
    #: trains in it varies from run to run
    train_seconds: float = profile_field("compare_seconds")
    #: training budget of each method in sampled batches of samples_per_batch responses (their
    #: updates included), the evaluations scheduled in batches too: the same responses for every
    #: method and the same numbers for the same seed on one machine; None: the budget is
    #: train_seconds
    train_batches: int | None = None
    #: evaluations spread evenly over the budget, after the one before training
    eval_points: int = 4
    #: extra evaluations before the first even one, at 1/2, 1/4, ... of its time (where the curves
    #: climb)
    early_evals: int = 2
    #: held-out prompts every evaluation samples one response for
    n_eval_prompts: int = profile_field("n_eval_prompts")
    #: prompts per sampling + log-prob pass of an evaluation
    eval_batch_size: int = profile_field("eval_batch_size")
    #: responses sampled per batch by every method (PPO: as many prompts x 1; GRPO/RLOO:
    #: samples_per_batch / G prompts x G); PPO's rollout_batch_size
    samples_per_batch: int = profile_field("rollout_batch_size")
    group_size: int = 4  #: G, responses per prompt of GRPO and RLOO (their baseline is the group)
    #: optimiser steps per sampled batch of GRPO and RLOO (minibatches of samples_per_batch /
    #: updates_per_batch); DPO takes as many per batch, on as many responses (half as many pairs)
    updates_per_batch: int = 4
    #: Adam(W) learning rate of every policy adapter, constant (PPO's policy_lr)
    learning_rate: float = profile_field("policy_lr")
    #: beta of every method: PPO per-token k1 in the reward, RLOO sequence k1 in the reward, GRPO
    #: per-token k3 in the loss, DPO the beta of its loss (of the objective whose optimum it fits)
    kl_coef: float = profile_field("kl_coef")
    #: TRL GRPOConfig.loss_type ("dapo": TRL 1.16's default; "dr_grpo": Dr. GRPO)
    grpo_loss_type: str = "dapo"
    #: TRL GRPOConfig.scale_rewards: "group" (GRPO), "batch", "none" (Dr. GRPO)
    grpo_scale_rewards: str = "group"
    #: prompt tokens kept (from the left) by our samplers and the reward function
    max_prompt_length: int = profile_field("max_prompt_length")
    #: response length limit of every method, EOS included
    max_new_tokens: int = profile_field("max_new_tokens")
    #: rank, alpha and targets of every policy's adapter (the profile's)
    lora: LoRASpec = profile_field("lora")
    #: n of the best-of-n baselines (SFT samples, picked by the learned reward)
    best_of: tuple[int, ...] = (1, 4, 16)
    #: seed of every method's sampling, data order and adapter initialisation
    seed: int = profile_field("seed")

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora", as_lora_spec(self.lora))  # a mapping of its fields too
        if isinstance(self.best_of, list):  # a list too: hashable, equal
            object.__setattr__(self, "best_of", tuple(self.best_of))
        # types first (the string "30" is refused as such), then ranges, each error naming the field
        check_field_types(self, expected={"train_batches": ints_from(1, optional=True),
                                          "best_of": BEST_OF})
        check_positive(self, ("train_seconds", "learning_rate"))
        check_non_negative(self, ("kl_coef",))  # inf would zero every RLOO advantage without a word
        check_ints_from(self, 1, ("eval_points", "n_eval_prompts", "eval_batch_size",
                                  "updates_per_batch", "max_new_tokens", "samples_per_batch",
                                  "max_prompt_length"))
        check_ints_from(self, 1, ("train_batches",), optional=True)
        check_ints_from(self, 0, ("early_evals",))
        check_ints_from(self, 2, ("group_size",), why="a group needs siblings")
        check_seed(self)
        if self.samples_per_batch % (self.group_size * self.updates_per_batch):
            raise ValueError(
                f"samples_per_batch ({self.samples_per_batch}) must be a multiple of group_size x "
                f"updates_per_batch ({self.group_size} x {self.updates_per_batch})")
        if self.grpo_loss_type not in GRPO_LOSS_TYPES:
            raise ValueError(
                f"grpo_loss_type must be one of {GRPO_LOSS_TYPES}, got {self.grpo_loss_type!r}")
        if self.grpo_scale_rewards not in GRPO_SCALE_REWARDS:
            *first, last = map(repr, GRPO_SCALE_REWARDS)
            raise ValueError(f"grpo_scale_rewards must be {', '.join(first)} or {last}, "
                             f"got {self.grpo_scale_rewards!r}")
        if not self.best_of or min(self.best_of) < 1:
            raise ValueError(f"best_of must be {BEST_OF}, got {type(self.best_of).__name__} "
                             f"{self.best_of!r}")

    @property
    def budget_unit(self) -> str:
        """"batches" when train_batches is set, else "seconds"."""
        return "seconds" if self.train_batches is None else "batches"

    @property
    def prompts_per_batch(self) -> int:
        """Prompts per GRPO/RLOO generation batch: samples_per_batch / G."""
        return self.samples_per_batch // self.group_size

    @classmethod
    def from_profile(cls, profile: Any, **overrides: Any) -> CompareConfig:
        """The comparison of a profile: its budget (compare_batches, or compare_seconds when that is
        None) and every setting shared with its PPO config (`profile_field`: sampling lengths, LoRA
        shape, KL coefficient, policy learning rate, evaluation sizes, seed; its rollout batch as
        samples_per_batch)."""
        missing = [name for name in PROFILE_FIELDS if not hasattr(profile, name)]
        if missing:
            raise TypeError(
                f"profile must be a Profile (rlhf_helpers.runtime.profiles.get_profile()), got "
                f"{type(profile).__name__} without {', '.join(missing)}")
        budget = {"train_batches": profile.compare_batches}
        return cls(**profile_values(cls, profile, {**budget, **overrides}))

    def replace(self, **changes: Any) -> CompareConfig:
        """A copy with some fields changed (validated again)."""
        if "lora" in changes:
            changes["lora"] = as_lora_spec(changes["lora"], self.lora)
        return dataclasses.replace(self, **changes)
