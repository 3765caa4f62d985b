"""The settings every method of the comparison shares, and the few that are method-specific."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from rlhf_helpers.runtime.lora import LoRASpec, as_lora_spec

#: The trained methods of the comparison (best-of-n is the untrained baseline, `run_best_of_n`).
METHODS = ("ppo", "grpo", "rloo")
#: TRL 1.16's GRPO loss aggregations the comparison accepts (GRPOConfig.loss_type).
GRPO_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo")


#: Largest seed: TRL seeds numpy too, whose seeds are 32-bit.
MAX_SEED = 2**32 - 1
#: The Profile fields `CompareConfig.from_profile` reads.
PROFILE_FIELDS = ("compare_seconds", "compare_batches", "ppo")


def _check_real(name: str, value: object) -> None:
    """TypeError unless `value` is an int or float (bool and strings refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")


def _check_int(name: str, value: object) -> None:
    """TypeError unless `value` is an int (bool, float and strings refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class CompareConfig:
    """One comparison: the same budget, prompts, reward, LoRA policy and judge for every method."""

    #: training budget of each method when train_batches is None: CPU seconds of this process on a CPU, wall seconds
    #: on a GPU (model building and evaluations excluded); how much each method trains in it varies from run to run
    train_seconds: float = 30.0
    #: training budget of each method in sampled batches of samples_per_batch responses (their updates included),
    #: the evaluations scheduled in batches too: the same responses for every method and the same numbers for the
    #: same seed on one machine; None: the budget is train_seconds
    train_batches: int | None = None
    eval_points: int = 4  #: evaluations spread evenly over the budget, after the one before training
    #: extra evaluations before the first even one, at 1/2, 1/4, ... of its time (where the curves climb)
    early_evals: int = 2
    n_eval_prompts: int = 200  #: held-out prompts every evaluation samples one response for
    eval_batch_size: int = 256  #: prompts per sampling + log-prob pass of an evaluation
    #: responses sampled per batch by every method (PPO: 64 prompts x 1; GRPO/RLOO: 16 prompts x G = 4)
    samples_per_batch: int = 64
    group_size: int = 4  #: G, responses per prompt of GRPO and RLOO (their baseline is the group)
    #: optimiser steps per sampled batch of GRPO and RLOO (minibatches of samples_per_batch / 4)
    updates_per_batch: int = 4
    learning_rate: float = 1e-3  #: Adam(W) learning rate of every policy adapter, constant
    #: beta of every method: PPO per-token k1 in the reward, RLOO sequence k1 in the reward, GRPO per-token k3 in the
    #: loss
    kl_coef: float = 0.2
    grpo_loss_type: str = "dapo"  #: TRL GRPOConfig.loss_type ("dapo": TRL 1.16's default; "dr_grpo": Dr. GRPO)
    grpo_scale_rewards: str = "group"  #: TRL GRPOConfig.scale_rewards: "group" (GRPO), "batch", "none" (Dr. GRPO)
    max_prompt_length: int = 16  #: prompt tokens kept (from the left) by our samplers and the reward function
    max_new_tokens: int = 40  #: response length limit of every method, EOS included
    lora: LoRASpec = LoRASpec()  #: rank, alpha and targets of every policy's adapter (the profile's)
    best_of: tuple[int, ...] = (1, 4, 16)  #: n of the best-of-n baselines (SFT samples, picked by the learned reward)
    seed: int = 0  #: seed of every method's sampling, data order and adapter initialisation

    def __post_init__(self) -> None:
        # numbers first, by type (TypeError for the string "30"), then by range (ValueError), naming the field
        for name in ("train_seconds", "learning_rate", "kl_coef"):
            _check_real(name, getattr(self, name))
        for name in ("eval_points", "n_eval_prompts", "eval_batch_size", "updates_per_batch", "max_new_tokens",
                     "samples_per_batch", "max_prompt_length", "group_size",
                     "early_evals", "seed"):
            _check_int(name, getattr(self, name))
        if not 0 < self.train_seconds < math.inf:
            raise ValueError(f"train_seconds must be a finite number > 0, got {self.train_seconds!r}")
        for name in ("eval_points", "n_eval_prompts", "eval_batch_size", "updates_per_batch", "max_new_tokens",
                     "samples_per_batch", "max_prompt_length"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be an int in [0, 2**32 - 1] (numpy's seed range), got {self.seed!r}")
        object.__setattr__(self, "lora", as_lora_spec(self.lora))  # a mapping of its fields too
        if self.early_evals < 0:
            raise ValueError(f"early_evals must be an int >= 0, got {self.early_evals!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be an int >= 2 (a group needs siblings), got {self.group_size!r}")
        if self.samples_per_batch % (self.group_size * self.updates_per_batch):
            raise ValueError(f"samples_per_batch ({self.samples_per_batch}) must be a multiple of group_size x "
                             f"updates_per_batch ({self.group_size} x {self.updates_per_batch})")
        if self.train_batches is not None and (isinstance(self.train_batches, bool)
                                               or not isinstance(self.train_batches, int) or self.train_batches < 1):
            raise ValueError(f"train_batches must be None or an int >= 1, got {self.train_batches!r}")
        if not 0 < self.learning_rate < math.inf:
            raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")
        if not 0 <= self.kl_coef < math.inf:  # inf would zero every RLOO advantage without a word
            raise ValueError(f"kl_coef must be a finite number >= 0, got {self.kl_coef!r}")
        if self.grpo_loss_type not in GRPO_LOSS_TYPES:
            raise ValueError(f"grpo_loss_type must be one of {GRPO_LOSS_TYPES}, got {self.grpo_loss_type!r}")
        if self.grpo_scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"grpo_scale_rewards must be 'group', 'batch' or 'none', got {self.grpo_scale_rewards!r}")
        if (not isinstance(self.best_of, (tuple, list)) or not self.best_of
                or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.best_of)):
            raise ValueError(f"best_of must be a non-empty tuple of ints >= 1, got {type(self.best_of).__name__} "
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
        """The comparison of a profile: its budget (compare_batches, or compare_seconds when that is None), sampling
        lengths, LoRA shape, KL coefficient and policy learning rate (PPO's, shared by all), its rollout batch as
        samples_per_batch."""
        missing = [name for name in PROFILE_FIELDS if not hasattr(profile, name)]
        if missing:
            raise TypeError(f"profile must be a Profile (rlhf_helpers.runtime.profiles.get_profile()), got "
                            f"{type(profile).__name__} without {', '.join(missing)}")
        values = {"train_seconds": profile.compare_seconds, "train_batches": profile.compare_batches,
                  "n_eval_prompts": profile.ppo.n_eval_prompts,
                  "eval_batch_size": profile.ppo.eval_batch_size, "samples_per_batch": profile.ppo.rollout_batch_size,
                  "learning_rate": profile.ppo.policy_lr, "kl_coef": profile.ppo.kl_coef,
                  "max_prompt_length": profile.ppo.max_prompt_length, "max_new_tokens": profile.ppo.max_new_tokens,
                  "lora": profile.lora, "seed": profile.seed}
        if "lora" in overrides:  # {"r": 4} keeps the profile's targets
            overrides = {**overrides, "lora": as_lora_spec(overrides["lora"], profile.lora)}
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> CompareConfig:
        """A copy with some fields changed (validated again)."""
        if "lora" in changes:
            changes["lora"] = as_lora_spec(changes["lora"], self.lora)
        return dataclasses.replace(self, **changes)
