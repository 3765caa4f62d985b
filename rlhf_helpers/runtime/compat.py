"""Shims for the range of library versions the course admits (pyproject.toml), in one place."""

from __future__ import annotations

import dataclasses
from typing import Any


def checkpointing_off(config_class: type) -> dict[str, Any]:
    """Keyword arguments that turn activation (gradient) checkpointing off in `config_class`.

    `config_class` is transformers' TrainingArguments or a subclass (TRL's RewardConfig and
    SFTConfig default checkpointing ON, which breaks the course's adapter switching later).
    transformers 5.23 renamed the field `gradient_checkpointing` to `activation_checkpointing` and
    keeps the old name as a deprecated alias (with a FutureWarning); 5.15, Colab's version, knows
    only the old name. So pass the new name where it exists, else the old one.
    """
    if not dataclasses.is_dataclass(config_class):
        raise TypeError(f"config_class must be a TrainingArguments dataclass, got {config_class!r}")
    fields = {field.name for field in dataclasses.fields(config_class)}
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if name in fields:
            return {name: False}
    raise TypeError(f"config_class {config_class.__name__} has neither activation_checkpointing "
                    "nor gradient_checkpointing: not a transformers TrainingArguments")
