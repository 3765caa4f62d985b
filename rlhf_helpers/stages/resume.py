"""What a resumed training run may change, and the one-line errors naming the flag behind a bad
setting.

    out = Path("runs/ppo-tiny")
    record = read_run_record(out)
    config = resumed_config(record, out, "tiny", {"total_steps": 80})
    profile = resumed_profile(record, get_profile("tiny"), env_overrides(), out)
    flag_error(ValueError("kl_coef must be >= 0, got -1"), {"kl_coef": -1}, "the profile")
    # -> "--kl-coef must be..."

`train_ppo --resume` continues with what run.json records: the profile, the PPO settings, the reward
model (its weights come from the checkpoint, so the reward folder may be gone) and the prompts. Only
the RESUMABLE settings may differ; any other flag, override or prompt file that differs is refused
(exit 2), never silently ignored, and run.json keeps recording what the run did.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.run_folder import RUN_FILE, SetupError
from rlhf_helpers.runtime.config_fields import flag_name
from rlhf_helpers.runtime.data import data_dir, data_fingerprint
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import OVERRIDES_ENV

#: the PPO settings a resumed run may change; every other one is the run's own (run.json)
RESUMABLE = ("total_steps", "save_every", "eval_every", "progress_bar", "output_dir")
#: profile fields a resumed run takes from this machine: where it computes, not what it computes
MACHINE_FIELDS = ("device",)
#: profile fields whose "auto" resolves when a run starts (to what run.json then records)
AUTO_FIELDS = ("weights", "dtype")
#: the data files a run reads after its reward model exists: run.json records their SHA-256
PROMPT_FILES = ("prompts_train.jsonl", "prompts_test.jsonl")
#: other names of some PPO flags
ALIASES = {"total_steps": ("--steps",)}


def flag_error(error: Exception, given: dict[str, Any], source: str) -> str:
    """A config error names a field ("kl_coef must be..."): the flag when the command line set it,
    else the field after `source` (where the value came from)."""
    message = str(error)
    field = re.match(r"[\w.]*", message).group(0)  # "kl_coef", "lora.r"
    if field.split(".")[0] not in given:
        # a rule between fields, e.g. "rollout_batch_size (64) must be a multiple of
        # mini_batch_size (3)": name the flags given that it mentions
        mentioned = [flag_name(name) for name in given
                     if name != "output_dir" and re.search(rf"\b{name}\b", message)]
        return f"{source}{' with ' + ', '.join(mentioned) if mentioned else ''}: {message}"
    names = "/".join((flag_name(field.replace(".", "_")), *ALIASES.get(field, ())))
    return names + message[len(field):]


def flat_settings(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"lora": {"r": 8}} -> {"lora_r": 8}: one entry per flag."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        out.update(flat_settings(value, f"{prefix}{key}_") if isinstance(value, dict)
                   else {prefix + key: value})
    return out


def resumed_config(record: dict[str, Any], output_dir: Path, profile_name: str,
                   given: dict[str, Any]) -> PPOConfig:
    """The PPO config recorded in output_dir/run.json (`record`), with the resumable flags of
    `given` applied. SetupError when the run was made with another profile, or when a flag that is
    not resumable differs from the record (it would be silently ignored)."""
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
            raise SetupError(f"--resume: {flag_name(key)} {value} differs from the run's "
                             f"{recorded[key]} (run.json); a resumed run keeps its settings: start "
                             "a new --output-dir to change it")
    return wanted


def _plain(value: Any) -> Any:
    """A value as run.json holds it (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(value, default=str))


def resumed_profile(record: dict[str, Any], current: Any, overrides: dict[str, Any],
                    output_dir: Path) -> Any:
    """The run's profile as run.json records it, on this machine's device (`current` gives the
    fields an older run.json lacks). SetupError when `overrides` ($RLHF_PROFILE_OVERRIDES) set a
    field that is not resumable to another value than the run's: it would be silently ignored."""
    recorded = {k: v for k, v in record["profile"].items() if k not in ("name", *MACHINE_FIELDS)}
    # a record from before the field: the model was not changed
    recorded.setdefault("architecture", None)
    try:
        profile = current.replace(**recorded)
    except (TypeError, ValueError) as error:
        raise SetupError(f"--resume: the profile in {output_dir / RUN_FILE}: {error}") from None
    # a moved checkout
    if profile.is_tiny and not Path(profile.sft_model_path, "config.json").is_file():
        raise SetupError(f"--resume: the run's SFT model {profile.sft_model_path} ({RUN_FILE}) is "
                         "gone; a resumed run keeps its model: start a new --output-dir")
    saved = flat_settings(_plain(dataclasses.asdict(profile)))
    for name, value in overrides.items():
        if name in RESUMABLE or (name in AUTO_FIELDS and value == "auto"):
            continue
        try:
            wanted = flat_settings(_plain(dataclasses.asdict(profile.replace(**{name: value}))))
        except (TypeError, ValueError) as error:
            raise SetupError(f"--resume: ${OVERRIDES_ENV}: {error}") from None
        # a nested setting (architecture) may add or drop keys
        for key in sorted(wanted.keys() | saved.keys()):
            new, old = wanted.get(key), saved.get(key)
            if new != old:
                shown = key.removeprefix("ppo_")
                raise SetupError(f"--resume: ${OVERRIDES_ENV} sets {shown} {new!r}, the run's is "
                                 f"{old!r} ({RUN_FILE}); a resumed run keeps its settings: leave "
                                 "it out, or start a new --output-dir to change it")
    return profile


def check_resumed_inputs(record: dict[str, Any], reward_dir: str | None,
                         reward_train_pairs: int | None, output_dir: Path) -> None:
    """SetupError when --reward-dir, --reward-train-pairs or the prompt files differ from what the
    run recorded: the checkpoint holds the run's reward model, and its history was sampled from its
    prompts."""
    saved_dir = record.get("reward_dir")
    if reward_dir is not None and (
            saved_dir is None or Path(reward_dir).resolve() != Path(saved_dir).resolve()):
        raise SetupError(f"--resume: --reward-dir {reward_dir} differs from the run's {saved_dir} "
                         f"({RUN_FILE}); the checkpoint holds the run's reward model, which a "
                         "resumed run keeps: leave the flag out, or start a new --output-dir")
    saved_pairs = record.get("reward_train_pairs")
    if reward_train_pairs is not None and reward_train_pairs != saved_pairs:
        had = saved_pairs if saved_pairs is not None else "none (all pairs, or a --reward-dir)"
        raise SetupError(f"--resume: --reward-train-pairs {reward_train_pairs} differs from the "
                         f"run's {had} ({RUN_FILE}); a resumed run keeps its reward model (the "
                         "checkpoint holds it): leave the flag out")
    saved_prompts = record.get("prompts")
    if isinstance(saved_prompts, dict):  # run.json of an older version may lack it
        now = data_fingerprint(PROMPT_FILES)
        for name in PROMPT_FILES:
            if name in saved_prompts and saved_prompts[name] != now[name]:
                raise SetupError(f"--resume: {data_dir() / name} is not the file the run trained "
                                 f"on (its SHA-256 differs from {RUN_FILE}'s); a resumed run keeps "
                                 "its prompts: point $RLHF_DATA_DIR at the run's data "
                                 f"({record.get('data_dir')}), or start a new --output-dir")


def run_record(profile: Any, config: PPOConfig, reward_dir: Path | None,
               reward_train_pairs: int | None, num_processes: int, resumed: dict[str, Any]
               | None = None, compute: dict[str, Any] | None = None) -> dict[str, Any]:
    """What run.json holds: what the run did. A resumed run keeps the record's reward folder, reward
    pairs and prompts (its own came from the checkpoint), and updates the settings it may change.
    `compute`: the dtype the forward passes computed in and whether a loss scaler ran
    (`doctor.compute_record`: the doctor reads it)."""
    record = {"profile": dataclasses.asdict(profile), "ppo_config": config.to_dict(),
              **({"compute": compute} if compute is not None else {}),
              "reward_dir": None if reward_dir is None else str(reward_dir),
              "reward_train_pairs": reward_train_pairs,  # None: all pairs, or a --reward-dir
              "prompts": data_fingerprint(PROMPT_FILES), "data_dir": str(data_dir().resolve()),
              "num_processes": num_processes}
    if resumed is not None:
        record.update({key: resumed.get(key)
                       for key in ("reward_dir", "reward_train_pairs", "prompts", "data_dir")})
    return record
