"""What a resumed training run may change, and the one-line errors that name the flag behind a bad setting.

    config, reward_dir = resumed_config(Path("runs/ppo-tiny"), "tiny", {"total_steps": 80})
    flag_error(ValueError("kl_coef must be >= 0, got -1"), {"kl_coef": -1}, "the profile")  # "--kl-coef must be..."

`train_ppo --resume` continues with the PPO settings and reward folder recorded in run.json; only the
RESUMABLE settings may differ, any other flag that differs is refused (exit 2).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.run_folder import RUN_FILE, SetupError, read_run_record
from rlhf_helpers.runtime.config_fields import flag_name
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: the PPO settings a resumed run may change; every other one is the run's own (run.json)
RESUMABLE = ("total_steps", "save_every", "eval_every", "progress_bar", "output_dir")
#: other names of some PPO flags
ALIASES = {"total_steps": ("--steps",)}


def flag_error(error: Exception, given: dict[str, Any], source: str) -> str:
    """A config error names a field ("kl_coef must be..."): the flag when the command line set it, else
    the field after `source` (where the value came from)."""
    message = str(error)
    field = re.match(r"[\w.]*", message).group(0)  # "kl_coef", "lora.r"
    if field.split(".")[0] not in given:
        # a rule between fields ("rollout_batch_size (64) must be a multiple of mini_batch_size (3)"): name
        # the flags given that it mentions
        mentioned = [flag_name(name) for name in given if name != "output_dir" and re.search(rf"\b{name}\b", message)]
        return f"{source}{' with ' + ', '.join(mentioned) if mentioned else ''}: {message}"
    names = "/".join((flag_name(field.replace(".", "_")), *ALIASES.get(field, ())))
    return names + message[len(field):]


def flat_settings(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"lora": {"r": 8}} -> {"lora_r": 8}: one entry per flag."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        out.update(flat_settings(value, f"{prefix}{key}_") if isinstance(value, dict) else {prefix + key: value})
    return out


def resumed_config(output_dir: Path, profile_name: str, given: dict[str, Any]) -> tuple[PPOConfig, str | None]:
    """(the PPO config, the reward folder) recorded in output_dir/run.json, with the resumable flags of
    `given` applied. SetupError when run.json is missing or malformed, when the run was made with another
    profile, or when a flag that is not resumable differs from the record (it would be silently ignored)."""
    record = read_run_record(output_dir)
    recorded_profile = record["profile"]["name"]
    if recorded_profile != profile_name:
        raise SetupError(f"--resume: {output_dir} is a run of the {recorded_profile!r} profile, "
                         f"not {profile_name!r}")
    try:
        saved = PPOConfig.from_dict(record["ppo_config"])
    except (TypeError, ValueError) as error:
        raise SetupError(f"{output_dir / RUN_FILE}: {error}") from None
    try:
        wanted = saved.replace(**given)
    except (TypeError, ValueError) as error:
        raise SetupError(flag_error(error, given, f"{output_dir / RUN_FILE}")) from None
    recorded = flat_settings(saved.to_dict())
    for key, value in flat_settings(wanted.to_dict()).items():
        if key not in RESUMABLE and value != recorded[key]:
            raise SetupError(f"--resume: {flag_name(key)} {value} differs from the run's {recorded[key]} "
                             "(run.json); a resumed run keeps its settings: start a new --output-dir to change it")
    return wanted, record.get("reward_dir")
