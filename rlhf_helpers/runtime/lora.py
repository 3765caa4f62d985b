"""The one LoRA spec of a run: rank, alpha and target modules of every adapter (policy, value,
reward).

    spec = LoRASpec(r=8, alpha=16, target_modules=GPT2_TARGETS)
    profile.lora, PPOConfig.lora, RewardTrainingConfig.lora, CompareConfig.lora   # the same spec
    SharedLoRAModel(base, pad_id, eos_id, lora=config.lora)                      # built from it

The profile holds it, every config takes it from there, and `PPOTrainer` refuses a model whose
adapters were built with another spec than its config names. LoRA dropout is always 0 (two forwards
of the same input must agree in PPO's ratio), so it is not a setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The projections of GPT-2 (the tiny model) that LoRA wraps: attention qkv and output, MLP in and
#: out.
GPT2_TARGETS = ("c_attn", "c_proj", "c_fc")
#: Every projection of a Llama layer (SmolLM2): attention and MLP.
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoRASpec:
    """Shape of the low-rank update W + (alpha / r) B A of every wrapped projection."""

    r: int = 8  #: rank of A (r, in) and B (out, r)
    alpha: int = 16  #: scale numerator: the update is multiplied by alpha / r
    target_modules: tuple[str, ...] = GPT2_TARGETS  #: names of the modules LoRA wraps

    def __post_init__(self) -> None:
        for name in ("r", "alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"lora.{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"lora.{name} must be an int >= 1, got {value!r}")
        targets = self.target_modules
        if isinstance(targets,
                      str) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError("lora.target_modules must be a non-empty tuple of module names such "
                             f"as {GPT2_TARGETS}, got {targets!r}")
        object.__setattr__(self, "target_modules", tuple(targets))  # a list too: hashable, equal

    @property
    def scale(self) -> float:
        """alpha / r, the factor of the low-rank update."""
        return self.alpha / self.r

    def replace(self, **changes: Any) -> LoRASpec:
        """A validated copy with some fields changed; unknown names raise ValueError."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(
                f"unknown LoRASpec field(s): {sorted(unknown)} (fields: r, alpha, target_modules)")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """{"r", "alpha", "target_modules" (a list)}: JSON-able, `as_lora_spec` reads it back."""
        return {"r": self.r, "alpha": self.alpha, "target_modules": list(self.target_modules)}


def as_lora_spec(value: Any, base: LoRASpec | None = None) -> LoRASpec:
    """`value` as a LoRASpec: a LoRASpec unchanged, a mapping as changes to `base` (default: the
    default spec), so {"r": 4} keeps the profile's targets. Anything else: TypeError naming lora."""
    if isinstance(value, LoRASpec):
        return value
    if isinstance(value, Mapping):
        return (base or LoRASpec()).replace(**dict(value))
    raise TypeError(
        f"lora must be a LoRASpec or a mapping of its fields, got {type(value).__name__}")
