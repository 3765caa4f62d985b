"""A profile's shared model: the SFT base, the reward step's adapter, new policy/value adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.models import load_causal_lm, load_tokenizer
from rlhf_helpers.runtime.ppo_config import PPOConfig


def build_shared_model(profile: Any, config: PPOConfig,
                       reward_dir: str | Path | None) -> tuple[SharedLoRAModel, Any]:
    """(SharedLoRAModel, tokenizer) for `profile`: its SFT model (dropout 0) as the one base.

    `reward_dir=None` gives a fresh, untrained reward adapter (only for tests and timing runs: its
    scores are noise); pass the folder written by `train_reward_model` for real training.
    """
    tokenizer = load_tokenizer(profile)
    base = load_causal_lm(profile)
    model = SharedLoRAModel(base, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, lora=config.lora,
                            reward_dir=reward_dir, seed=config.seed)
    return model, tokenizer
