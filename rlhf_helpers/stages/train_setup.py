"""The training command's checks before its model is built (`train_ppo` runs them).

    check_folder_holds(resume, output_dir)       # SetupError: links, checkpoints unfit for --resume
                                                 # (or a new run over an earlier run's files, or a
                                                 # person's step-NNNNNN folder)
    record, config, profile = resumed_settings(...)  # --resume: run.json's, checkpoint checked
    check_reward_dir(reward_dir)                 # --reward-dir: a complete reward folder

Each SetupError is one line of the command's exit 2, found before the PPO model is built.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.checkpoints.folder import resolve_latest, stray_problem, stray_steps
from rlhf_helpers.ppo.checkpoints.run_identity import recorded_run_id
from rlhf_helpers.ppo.checkpoints.save_load import LATEST_FILE, checkpoints, latest_checkpoint
from rlhf_helpers.runtime.models import load_tokenizer, unknown_tokens
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import env_overrides
from rlhf_helpers.stages.diagnose import DIAGNOSIS_FILE
from rlhf_helpers.stages.resume import (
    RESUMABLE,
    check_resumed_inputs,
    resumed_config,
    resumed_profile,
)
from rlhf_helpers.stages.reward import reward_dir_problem
from rlhf_helpers.stages.run_files.curves_page import CURVES_FILE
from rlhf_helpers.stages.run_files.run_folder import (
    RUN_FILE,
    SetupError,
    check_resume_checkpoint,
    check_run_files,
    read_run_record,
)
from rlhf_helpers.stages.train_args import warmup_problem

METRICS_FILE = "metrics.jsonl"


#: What the command writes into its folder: a new run never writes over any of them.
RUN_FILES = (RUN_FILE, METRICS_FILE, CURVES_FILE, DIAGNOSIS_FILE, LATEST_FILE)


def check_folder_holds(resume: bool, output_dir: Path) -> None:
    """SetupError unless the folder's run files are plain files and its checkpoints fit
    `--resume`; a new run also refuses a folder holding any run file (an earlier run's, stopped
    before its first checkpoint, or a person's copy), which it would overwrite. Any run refuses
    a folder holding something named like a checkpoint that is none (a person's `step-000001/`,
    `folder.stray_steps`), which a save of that step would replace; a resume's own checkpoint,
    the one `latest` names, is judged by the resume."""
    check_run_files(output_dir, RUN_FILES)  # no links
    if not resume and (latest_checkpoint(output_dir) is not None or checkpoints(output_dir)):
        raise SetupError(f"{output_dir} already holds checkpoints: pass --resume to continue, or "
                         "choose another --output-dir")
    if resume and not (output_dir / LATEST_FILE).exists() and not checkpoints(output_dir):
        raise SetupError(f"--resume: no checkpoint found in {output_dir}")
    found = [] if resume else run_files_in(output_dir)
    if found:
        raise SetupError(f"{output_dir} already holds {', '.join(found)} (an earlier run's, "
                         "stopped before its first checkpoint, or a copy), which a new run would "
                         "overwrite: choose another --output-dir, or remove those files if that "
                         "run is abandoned")
    strays = stray_steps(output_dir)  # a person's step-000001/: a save would replace it
    if resume:  # the checkpoint `latest` names is judged by the resume's own check
        strays.pop(resolve_latest(output_dir)[0], None)
    problem = stray_problem(strays)
    if problem is not None:
        raise SetupError(problem)


def run_files_in(output_dir: Path) -> list[str]:
    """The names of RUN_FILES present in `output_dir` (as anything, links included)."""
    return [name for name in RUN_FILES if os.path.lexists(output_dir / name)]


def resumed_settings(args: argparse.Namespace, profile: Any, given: dict[str, Any],
                     output_dir: Path) -> tuple[dict[str, Any], PPOConfig, Any]:
    """(run.json's record, the config, the profile) of a resumed run, its checkpoint checked file by
    file."""
    record = read_run_record(output_dir)
    check_resumed_inputs(record, args.reward_dir, args.reward_train_pairs, output_dir)
    from_env = env_overrides()
    # first: refuses a run of another profile
    config = resumed_config(record, output_dir, profile.name, {
        **{name: value for name, value in from_env.items() if name in RESUMABLE}, **given})
    profile = resumed_profile(record, profile, from_env, output_dir)
    # its warm-up against the new total
    problem = warmup_problem(config, f" (the run's, {RUN_FILE})")
    if problem is not None:
        raise SetupError(f"--resume: {problem}")
    # the checkpoint is read (safely) and checked file by file before the model is built, and
    # must be of this run (its id) and of its LoRA shape
    resumed_step = check_resume_checkpoint(output_dir, recorded_run_id(output_dir), config.lora)
    if resumed_step >= config.total_steps:
        raise SetupError(
            f"--steps {config.total_steps}: the checkpoint {latest_checkpoint(output_dir)} "
            f"is already at step {resumed_step}; pass a larger total to train further")
    return record, config, profile


def check_reward_dir(reward_dir: str) -> None:
    """SetupError unless --reward-dir is a complete reward folder (its own checksums)."""
    problem = reward_dir_problem(reward_dir)  # a zeroed adapter fails
    if problem is not None:
        if Path(reward_dir).is_file():
            problem = "it is a file, not a folder"
        raise SetupError(
            f"--reward-dir {reward_dir}: not a complete reward folder ({problem}); train one "
            "with `python -m rlhf_helpers.stages.reward --out FOLDER`, or leave the flag out")


def warn_unknown_tokens(profile: Any, prompts: Sequence[str], is_main: bool) -> None:
    """One warning when training prompts hold tokens the tokenizer does not know."""
    unknown, only_unknown = unknown_tokens(load_tokenizer(profile), prompts)
    if unknown > 0 and is_main:  # once: what the policy is asked is not what the file says
        print(f"warning: {100 * unknown:.2g}% of the training prompts' tokens are unknown to the "
              f"tokenizer ({only_unknown} of {len(prompts)} prompts are nothing else): they reach "
              "the policy as the unknown token whatever they said (emoji, another script, words "
              "the tiny vocabulary lacks)",
              file=sys.stderr)
