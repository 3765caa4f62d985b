"""The adapters and heads of the shared model, each initialised from the model's own seed.

    peft, value_head, score_head = attach_adapters(base_lm, LoRASpec(), reward_dir=None, seed=0)

`SharedLoRAModel` wraps the base causal LM in peft with the trained `policy` and `value` LoRA
adapters and the frozen `reward` one (fresh, or loaded from the reward step's folder with its score
head), and adds the value head. Their initial weights depend on `seed` only, never on the caller's
RNG.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model
from torch import nn

from rlhf_helpers.ppo.model.adapters import load_reward_adapter, lora_config, uses_conv1d
from rlhf_helpers.ppo.model.value_head import ScalarHead
from rlhf_helpers.runtime.lora import LoRASpec


def check_special_tokens(pad_token_id: int | None, eos_token_id: int | None) -> None:
    """ValueError unless both ids are set and differ (pad == EOS would mask each response's EOS)."""
    if pad_token_id is None or eos_token_id is None:
        raise ValueError("pad_token_id and eos_token_id must both be set")
    if pad_token_id == eos_token_id:
        raise ValueError(f"pad_token_id must differ from eos_token_id (both {pad_token_id}): with "
                         "pad == EOS, masks built from the pad id hide the EOS of every response")


def attach_adapters(base_model: nn.Module, lora: LoRASpec, reward_dir: str | Path | None,
                    seed: int) -> tuple[Any, ScalarHead, ScalarHead]:
    """(peft model, value head, score head): `base_model` with the policy, value and reward adapters
    of shape `lora` (the reward adapter and score head from `reward_dir` when given), the heads
    initialised from `seed`; the caller's RNG state is left as it was."""
    r, alpha, targets = lora.r, lora.alpha, lora.target_modules
    fan_in_fan_out = uses_conv1d(base_model)
    hidden_size = base_model.config.get_text_config().hidden_size
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # adapter and head initialisation do not depend on the caller's RNG
    try:
        config = lora_config(r, alpha, targets, fan_in_fan_out)
        with warnings.catch_warnings():  # peft reads transformers' deprecated checkpointing flag
            warnings.simplefilter("ignore", FutureWarning)
            peft = get_peft_model(base_model, config, adapter_name="policy")
        peft.add_adapter("value", lora_config(r, alpha, targets, fan_in_fan_out))
        value_head = ScalarHead(hidden_size, bias=True, init_std=1e-2)
        if reward_dir is None:
            peft.add_adapter("reward", lora_config(r, alpha, targets, fan_in_fan_out))
            score_head = ScalarHead(hidden_size, bias=False, init_std=1.0 / hidden_size**0.5)
        else:
            score_head = load_reward_adapter(peft, reward_dir, hidden_size, fan_in_fan_out)
    finally:
        torch.random.set_rng_state(generator_state)
    return peft, value_head, score_head
