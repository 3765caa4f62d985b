"""Config fields that repeat a profile's setting: the value comes from the profile, written once.

    @dataclass
    class RewardTrainingConfig:
        learning_rate: float = profile_field("reward_lr")   # default: the tiny profile's reward_lr

    values = profile_values(RewardTrainingConfig, gpu, {"batch_size": 8})   # from_profile's values

The configs of the other stages (the reward model's, the comparison's) use some of the profile's
settings under their own names. A `profile_field` names the setting it repeats: its default is the
tiny profile's value (the course's default profile), and `profile_values` reads every such field
from any profile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlhf_helpers.runtime.lora import as_lora_spec
from rlhf_helpers.runtime.profiles import tiny_profile

#: The key of a field's metadata that names the profile setting it repeats.
PROFILE_SETTING = "profile_setting"


def profile_setting(profile: Any, name: str) -> Any:
    """A profile's setting by name: a Profile field (or its `seed` / `lora`), else a field of its
    PPOConfig."""
    return getattr(profile, name) if hasattr(profile, name) else getattr(profile.ppo, name)


def profile_field(name: str) -> Any:
    """A dataclass field repeating the profile setting `name` (`profile_setting`): its default is
    the tiny profile's, read when a config is built without it."""
    return dataclasses.field(default_factory=lambda: profile_setting(tiny_profile(), name),
                             metadata={PROFILE_SETTING: name})


def profile_values(cls: type, profile: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """{field: `profile`'s setting} for every `profile_field` of the dataclass `cls`, then
    `overrides`; a mapping for `lora` changes the profile's spec ({"r": 4} keeps its targets)."""
    values = {field.name: profile_setting(profile, field.metadata[PROFILE_SETTING])
              for field in dataclasses.fields(cls) if PROFILE_SETTING in field.metadata}
    values.update(overrides)
    if "lora" in overrides:
        values["lora"] = as_lora_spec(overrides["lora"], profile.lora)
    return values
