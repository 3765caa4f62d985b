"""The environment variables that choose and change a profile: $RLHF_PROFILE names it,
$RLHF_PROFILE_OVERRIDES (a JSON object) changes its settings.

    RLHF_PROFILE=gpu RLHF_PROFILE_OVERRIDES='{"total_steps": 5}' python -m ...
    env_overrides()   # {"total_steps": 5}; {} when unset; ValueError for anything but one object

`runtime.profiles.get_profile` reads both; the names here are imported from there too. Standard
library only.
"""

from __future__ import annotations

import json
import os
from typing import Any

#: Environment variable that picks the profile when `get_profile` gets no name.
PROFILE_ENV = "RLHF_PROFILE"
#: Environment variable with a JSON object of field overrides, e.g. '{"total_steps": 5}' (quick
#: runs): any Profile field, or any PPOConfig field by name.
OVERRIDES_ENV = "RLHF_PROFILE_OVERRIDES"
PROFILE_NAMES = ("tiny", "gpu", "auto")


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:  # json keeps the last silently: say which setting was given twice
        raise ValueError(
            f"${OVERRIDES_ENV} sets {', '.join(repeated)} twice; give each setting once")
    return dict(pairs)


def env_overrides() -> dict[str, Any]:
    """Field overrides from $RLHF_PROFILE_OVERRIDES (a JSON object), {} when it is unset."""
    raw = os.environ.get(OVERRIDES_ENV, "").strip()
    if not raw:
        return {}
    try:
        values = json.loads(raw, object_pairs_hook=_refuse_repeated_keys)
    except json.JSONDecodeError as err:
        raise ValueError(f"${OVERRIDES_ENV} must be a JSON object such as '{{\"total_steps\": "
                         f"5}}', got {raw!r} ({err})") from None
    if not isinstance(values, dict):
        raise ValueError(f"${OVERRIDES_ENV} must be a JSON object, got {raw!r}")
    return values
