"""What both cluster exports read from a run: its PPOConfig, the GPUs of one node, the model and
data paths, and its KL target per token.

    config = as_config("gpu")                 # a profile name, a Profile or a PPOConfig
    n = check_gpus(4)                         # an int in [1, MAX_GPUS_PER_NODE], else ValueError
    paths = run_paths({"model": "/models/sft"})   # PLACEHOLDERS with the given paths in
    per_token_target_kl(config)               # target_kl / max_new_tokens (None: no target)

`cluster.export` writes the verl and OpenRLHF settings from these; every bad argument is a
ValueError naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import Profile, get_profile

#: Placeholders of the paths the export cannot know; `paths={"model": ...}` replaces them.
PLACEHOLDERS = {"model": "MODEL_PATH", "reward_model": "REWARD_MODEL_PATH",
                "train_prompts": "TRAIN_PROMPTS", "val_prompts": "VAL_PROMPTS"}
#: The most GPUs one node (one NVLink domain: GB200 NVL72) holds; the export writes one-node runs
#: (nnodes=1).
MAX_GPUS_PER_NODE = 72


def as_config(run: str | Profile | PPOConfig) -> PPOConfig:
    """A PPOConfig from a profile name (`get_profile`: $RLHF_PROFILE_OVERRIDES applies), a Profile
    or a config."""
    if isinstance(run, PPOConfig):
        return run
    if isinstance(run, str):
        try:
            return get_profile(run).ppo
        except ValueError as error:  # the name, or $RLHF_PROFILE_OVERRIDES: say it came via `run`
            raise ValueError(f"run {run!r}: {error}") from None
    if not isinstance(run, Profile):
        raise ValueError("run must be a profile name, a Profile or a PPOConfig, got "
                         f"{type(run).__name__} {run!r}")
    return run.ppo


def run_paths(paths: Mapping[str, str] | None) -> dict[str, str]:
    """PLACEHOLDERS with the paths `paths` names in place of theirs; ValueError for a path that is
    not a non-empty string or a name PLACEHOLDERS does not know."""
    if paths is not None and not isinstance(paths, Mapping):
        raise ValueError(f"paths must be a mapping such as {{'model': '/models/sft'}}, got "
                         f"{type(paths).__name__} {paths!r}")
    bad = {name: path for name, path in (paths or {}).items()
           if not isinstance(path, str) or not path.strip()}
    if bad:
        raise ValueError(f"paths must map each name to a non-empty path string, got {bad!r}")
    unknown = set(paths or {}) - set(PLACEHOLDERS)
    if unknown:
        raise ValueError(f"unknown path name(s) {sorted(unknown)}; known: {sorted(PLACEHOLDERS)}")
    return {**PLACEHOLDERS, **(paths or {})}


def check_gpus(n_gpus: int) -> int:
    """`n_gpus` when it is an int in [1, MAX_GPUS_PER_NODE] (the GPUs of one node); else
    ValueError."""
    is_int = isinstance(n_gpus, int) and not isinstance(n_gpus, bool)
    if not is_int or not 1 <= n_gpus <= MAX_GPUS_PER_NODE:
        raise ValueError(f"n_gpus must be an int in [1, {MAX_GPUS_PER_NODE}] (the GPUs of one "
                         f"node), got {n_gpus!r}")
    return n_gpus


def per_token_target_kl(config: PPOConfig,
                        mean_response_tokens: float | None = None) -> float | None:
    """The course's target (k1 KL per sequence) as their target (mean KL per token): divided by the
    mean response length, max_new_tokens unless given (exact when responses use the whole
    budget)."""
    if mean_response_tokens is not None and (isinstance(mean_response_tokens, bool)
                                             or not isinstance(mean_response_tokens, (int, float))
                                             or not 0 < mean_response_tokens < math.inf):
        raise ValueError(f"mean_response_tokens must be None or a finite number > 0, got "
                         f"{type(mean_response_tokens).__name__} {mean_response_tokens!r}")
    if config.target_kl is None:
        return None
    tokens = config.max_new_tokens if mean_response_tokens is None else mean_response_tokens
    return float(config.target_kl) / float(tokens)
