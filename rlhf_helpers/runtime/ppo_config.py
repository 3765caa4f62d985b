"""The typed configuration of one PPO run (cleanrl style: one `#:` comment per field).

    config = PPOConfig(clip_eps=0.1)          # the defaults, one field changed
    config = get_profile("tiny").ppo          # a profile's PPO settings are a PPOConfig
    config = config.replace(total_steps=5)    # a validated copy

The one place the PPO settings and their defaults live: the profiles hold one, the training command
line makes a flag of every field (`config_fields.add_field_flags`, help = the `#:` comment), and
$RLHF_PROFILE_OVERRIDES reaches every field by name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlhf_helpers.core.kl_estimators import KL_ESTIMATORS
from rlhf_helpers.core.registry import Registry
from rlhf_helpers.runtime.config_fields import check_field_types, check_options
from rlhf_helpers.runtime.config_limits import (
    PPO_LIMITS,
    check_big_ints,
    check_counts,
    check_limits,
    check_non_negative,
    check_positive,
    check_seed,
)
from rlhf_helpers.runtime.lora import LoRASpec, as_lora_spec

#: The int settings bounded by config_limits.MAX_COUNT (the seed: by config_limits.MAX_SEED).
COUNTS = ("rollout_batch_size", "mini_batch_size", "ppo_epochs", "max_prompt_length",
          "max_new_tokens", "kl_horizon", "value_warmup_steps", "total_steps", "save_every",
          "eval_every", "n_eval_prompts", "eval_batch_size")


@dataclass
class PPOConfig:
    """Every knob of the shared-LoRA PPO loop."""

    #: the fields that name a registered value: the registry is the one list of the names each
    #: accepts (its flag's choices, its check, the cluster export's names for it)
    OPTIONS: ClassVar[Mapping[str, Registry[Any]]] = {"kl_kind": KL_ESTIMATORS}

    # --- rollouts
    rollout_batch_size: int = 64  #: prompts sampled per PPO iteration (one experience batch)
    mini_batch_size: int = 16  #: sequences per gradient step inside an iteration
    ppo_epochs: int = 4  #: passes over each experience batch (shuffled minibatches each pass)
    max_prompt_length: int = 16  #: prompts longer than this many tokens are cut from the left
    max_new_tokens: int = 40  #: response length limit, EOS included
    #: sampling temperature T of rollouts (no top-k/top-p). The policy PPO trains is then the
    #: tempered one, pi_T = softmax(z / T): old and new log-probs of the ratio both come from z / T
    #: (the distribution that drew the tokens, so the importance ratio is exact and 1 before any
    #: update), and the reference is tempered too, ref_T = softmax(z_ref / T), so the KL penalty and
    #: the kl metric estimate KL(pi_T || ref_T) on samples of pi_T (0 while policy == reference).
    #: TRL's PPOTrainer and OpenRLHF do the same. 1.0: the policy itself.
    temperature: float = 1.0
    # --- losses
    clip_eps: float = 0.2  #: PPO ratio clip range epsilon
    value_clip: float | None = 0.2  #: clip new values to old +- this (None: no value clipping)
    #: weight of the value loss (separate adapter and optimiser, so only a scale)
    vf_coef: float = 1.0
    #: weight of the entropy bonus subtracted from the policy loss (0: off)
    entropy_coef: float = 0.0
    ptx_coef: float = 0.0  #: weight of the LM (ptx) loss on SFT text (0: off; needs ptx_texts)
    max_grad_norm: float = 1.0  #: gradient-norm clip of each optimiser step
    whiten_advantages: bool = True  #: masked whitening of the advantages over the experience batch
    # --- rewards and KL
    kl_coef: float = 0.05  #: beta of the per-token KL penalty (initial value when adaptive)
    #: target sequence KL of the adaptive controller (None: fixed beta)
    target_kl: float | None = None
    kl_horizon: int = 10000  #: horizon (in samples) of the adaptive KL controller
    #: KL estimator of the reward shaping, by name (core/kl_estimators.py has each one's formula)
    kl_kind: str = "k1"
    #: clip reward-model scores to +- this before shaping (None: off)
    score_clip: float | None = None
    missing_eos_penalty: float | None = None  #: added to the score of responses cut off without EOS
    gamma: float = 1.0  #: GAE discount
    lam: float = 0.95  #: GAE lambda
    # --- optimisation
    policy_lr: float = 1e-3  #: Adam learning rate of the policy adapter
    value_lr: float = 1e-3  #: Adam learning rate of the value adapter and value head
    value_warmup_steps: int = 0  #: first iterations that train only the critic (policy frozen)
    # --- LoRA adapters
    #: rank, alpha and targets of the policy and value adapters (the profile's)
    lora: LoRASpec = LoRASpec()
    # --- run
    total_steps: int = 60  #: PPO iterations of `PPOTrainer.train`
    seed: int = 0  #: seed of torch, sampling and prompt order, in [0, MAX_SEED]
    save_every: int = 0  #: write a checkpoint every this many iterations (0: only at the end)
    output_dir: str | None = None  #: where checkpoints and metrics go (None: nothing written)
    eval_every: int = 0  #: evaluate on held-out prompts every this many iterations (0: never)
    n_eval_prompts: int = 200  #: held-out prompts per evaluation
    #: prompts per batch of `PPOTrainer.evaluate` (sampling, log-prob and reward passes): bounds the
    #: (batch, response length, vocabulary) logits one pass holds in memory
    eval_batch_size: int = 64
    progress_bar: bool = True  #: show a tqdm progress bar in `train`

    def __post_init__(self) -> None:
        self.lora = as_lora_spec(self.lora)  # a mapping of its fields too (a checkpoint's config)
        self.validate()

    def validate(self) -> PPOConfig:
        """Raise ValueError naming the first field whose value cannot work (its type first), or that
        lies outside the range float32 arithmetic can hold (`config_limits.PPO_LIMITS` and
        MAX_COUNT, each range with its why)."""
        check_field_types(self)
        check_big_ints(self, PPO_LIMITS)
        for name in ("rollout_batch_size", "mini_batch_size", "ppo_epochs", "max_prompt_length",
                     "max_new_tokens", "total_steps", "kl_horizon", "n_eval_prompts",
                     "eval_batch_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.output_dir is not None and not self.output_dir.strip():
            raise ValueError("output_dir must be None or a folder, got an empty string")
        if self.rollout_batch_size % self.mini_batch_size:
            raise ValueError(f"rollout_batch_size ({self.rollout_batch_size}) must be a multiple "
                             f"of mini_batch_size ({self.mini_batch_size})")
        check_positive(self, ("temperature", "clip_eps", "max_grad_norm", "policy_lr", "value_lr"))
        check_non_negative(self, ("vf_coef", "entropy_coef", "ptx_coef", "kl_coef"))
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        for name in ("value_clip", "target_kl", "score_clip"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be None or a finite number > 0, got {value!r}")
        if self.missing_eos_penalty is not None and not math.isfinite(self.missing_eos_penalty):
            raise ValueError("missing_eos_penalty must be None or a finite number, got "
                             f"{self.missing_eos_penalty!r}")
        check_options(self, self.OPTIONS)
        # the adaptive controller multiplies beta by at most 1.2 per step: from 0 it never moves
        # (`core.kl.AdaptiveKLController`, which refuses it, once the model is built)
        if self.target_kl is not None and self.kl_coef == 0:
            raise ValueError(
                f"kl_coef must be > 0 when target_kl is set (got kl_coef 0, target_kl "
                f"{self.target_kl!r}): the adaptive controller scales beta up or down from "
                "kl_coef, and 0 stays 0; give a starting beta, or leave target_kl out (None) for "
                "no KL penalty")
        check_seed(self)
        if self.whiten_advantages and self.rollout_batch_size < 2:
            raise ValueError(
                "rollout_batch_size must be >= 2 when whiten_advantages is True: whitening "
                "divides by the variance over the batch's response tokens, and one response "
                f"may be a single token (got rollout_batch_size={self.rollout_batch_size}; "
                "use a bigger batch or whiten_advantages=False)")
        for name in ("save_every", "eval_every", "value_warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        # what float32 arithmetic can hold, and what means something (config_limits says why)
        check_limits(self, PPO_LIMITS)
        check_counts(self, COUNTS)
        check_counts(self.lora, ("alpha",), prefix="lora.")  # lora.r: preflight (< hidden size)
        return self

    def replace(self, **changes: Any) -> PPOConfig:
        """A validated copy with some fields changed; unknown names raise ValueError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown PPOConfig field(s): {sorted(unknown)}")
        if "lora" in changes:
            changes["lora"] = as_lora_spec(changes["lora"], self.lora)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["lora"] = self.lora.to_dict()
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PPOConfig:
        """Inverse of `to_dict`; unknown keys raise ValueError. The flat lora_r / lora_alpha /
        lora_target_modules of configs written before the LoRA spec are read as `lora`."""
        old = {"lora_r": "r", "lora_alpha": "alpha", "lora_target_modules": "target_modules"}
        if any(key in values for key in old):
            values = dict(values)
            lora = {new: values.pop(key) for key, new in old.items() if key in values}
            values["lora"] = as_lora_spec(lora, as_lora_spec(values.get("lora", LoRASpec())))
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown PPOConfig field(s): {sorted(unknown)}")
        return cls(**values)
