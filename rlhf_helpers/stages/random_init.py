"""The random-init base model of a profile whose weights are "random": the base model's
architecture (`runtime.architectures`) with seeded random weights and the shipped word-level
tokenizer (code paths only: a lent GPU machine's timing runs, tests). `stages.sft` fine-tunes it.

    spec = random_init_architecture(profile)     # the base's architecture, the profile's changes
    model = build_random_init_model(spec, tokenizer, seed=0, dtype=torch.float32)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlhf_helpers.runtime.architectures import architecture_of
from rlhf_helpers.runtime.data import data_dir
from rlhf_helpers.runtime.models import dropout_overrides
from rlhf_helpers.runtime.profiles import Profile


def random_init_tokenizer_dir() -> Path:
    """The shipped word-level tokenizer (data/models/tiny-sft) a random-init base model uses."""
    return data_dir() / "models" / "tiny-sft"


def random_init_architecture(profile: Profile,
                             architecture: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The architecture a random-init run builds: `architecture` if given, else the one of
    `profile.base_model` (`runtime.architectures`) with the profile's `architecture` changes.
    Refused when the profile's weights are not random, or a change names a field the base
    architecture lacks."""
    if profile.weights != "random":
        raise ValueError("architecture is only used with weights='random' (hub and gguf weights "
                         f"come with their own), got weights={profile.weights!r}")
    if architecture is not None:
        spec = dict(architecture)
    else:
        spec = architecture_of(profile.base_model)
        unknown = sorted(set(profile.architecture or {}) - set(spec))
        if unknown:
            raise ValueError(f"architecture changes {unknown} name no field of "
                             f"{profile.base_model}'s architecture ({', '.join(sorted(spec))})")
        spec.update(profile.architecture or {})
    if "model_type" not in spec:
        raise ValueError(
            f"architecture must name its model_type (e.g. 'llama'), got keys {sorted(spec)}")
    return spec


def build_random_init_model(spec: Mapping[str, Any], tokenizer: Any, seed: int, dtype: Any) -> Any:
    """`AutoModelForCausalLM` of architecture `spec` with seeded random weights, dropouts 0.

    Its pad / EOS / BOS ids are the tokenizer's (BOS = EOS when it has none); the vocabulary is
    max(spec's vocab_size, len(tokenizer)), so every token of the tokenizer has an embedding.
    """

    values = dict(spec)
    values["vocab_size"] = max(int(values.get("vocab_size", 0)), len(tokenizer))
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    for key, value in dropout_overrides(config).items():
        setattr(config, key, value)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = (tokenizer.bos_token_id if tokenizer.bos_token_id is not None
                           else tokenizer.eos_token_id)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)
