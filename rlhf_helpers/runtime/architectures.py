"""Architectures of the hub models the course uses, for building them with random weights (no hub).

    spec = architecture_of("HuggingFaceTB/SmolLM2-135M")   # a dict: model_type plus config fields
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)

The gpu profile's random weights (`weights="random"`), the TRL-baseline benchmark and the memory
benchmark build the same architecture this way on a machine without hub access. Imports nothing (the
TRL-baseline venv reads it too).
"""

from __future__ import annotations

from typing import Any

#: SmolLM2-135M's architecture (HuggingFaceTB/SmolLM2-135M config.json).
SMOLLM2_135M_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}

#: Hub id -> architecture of every base model that can be built with random weights.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "HuggingFaceTB/SmolLM2-135M": SMOLLM2_135M_CONFIG,
}


def architecture_of(base_model: str) -> dict[str, Any]:
    """A copy of the architecture of hub model `base_model` (a key of ARCHITECTURES)."""
    if base_model not in ARCHITECTURES:
        raise ValueError(f"base_model must be one of {sorted(ARCHITECTURES)} to be built with "
                         f"random weights, got {base_model!r}")
    return dict(ARCHITECTURES[base_model])
