"""Checks the training command runs before any work starts: each problem is one line, exit status 2.

    out = Path("runs/ppo-tiny")
    check_output_dir(out)                     # a writable folder, or SetupError saying why not
    check_run_files(out, ["run.json", "metrics.jsonl"])  # absent, or regular files of one name
    lock = lock_output_dir(out)               # this run's alone, or SetupError naming the live one
    record = read_run_record(out)             # run.json of a run to resume, validated

They run before the reward model is trained and before the model is built, so a typo or a full disk
costs a second, not a model build and a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.checkpoint import DEFAULT_KEEP
from rlhf_helpers.ppo.checkpoint_digest import MANIFEST_FILE, checkpoint_problem, unverified
from rlhf_helpers.ppo.checkpoint_folder import LATEST_FILE, checkpoints, resolve_latest
from rlhf_helpers.ppo.run_claim import lock_run_folder
from rlhf_helpers.ppo.run_identity import RUN_FILE, foreign_checkpoint_problem, lora_fit_problem
from rlhf_helpers.ppo.trainer_state import TRAINER_STATE_FILE, load_trainer_state
from rlhf_helpers.runtime.data import load_preferences, load_prompts, load_sft_corpus
from rlhf_helpers.runtime.interrupt import is_rank_zero
from rlhf_helpers.runtime.lock_files import file_kind
from rlhf_helpers.runtime.locks import FileLock, FolderInUse
from rlhf_helpers.runtime.preflight import (
    batch_memory_problem,
    device_problem,
    model_limits_problem,
)

#: Exit status of a bad argument or a run that cannot start (argparse's usage error is 2 too).
EXIT_SETUP = 2


class SetupError(SystemExit):
    """A run that cannot start: `main` prints the message as one line and the process exits 2.

    A SystemExit, so an uncaught one ends the process without a traceback; str() is the message.
    """

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_SETUP)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _probe_write(folder: Path) -> None:
    """Create, write, fsync and delete a small file in `folder` (what a checkpoint save will do). A
    new file of a name no one chose: a link or file left at a guessable name is never written
    through."""
    descriptor, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
    try:
        with open(descriptor, "wb") as handle:
            handle.write(b"\0" * 4096)  # one block: a full disk refuses it
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        Path(probe).unlink(missing_ok=True)


def check_output_dir(output_dir: Path, flag_name: str = "--output-dir") -> None:
    """Make sure `output_dir` is, or can become, a folder this process can write into.

    Refused with SetupError: a path that is a file or lies under one, a folder that cannot be
    created or written (permissions, a read-only file system: `os.access` and a probe write, since
    root passes permission checks that a read-only mount still refuses), and a full disk.
    """
    flag = f"{flag_name} {output_dir}"
    if output_dir.exists() and not output_dir.is_dir():
        raise SetupError(f"{flag} is a file, not a folder: choose a folder for the run")
    parent = output_dir
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SetupError(f"{flag} lies under {parent}, which is a file, not a folder")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(output_dir, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "no write permission", str(output_dir))
        _probe_write(output_dir)
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        if error.errno == errno.ENOSPC:
            raise SetupError(f"{flag}: no space left on its disk ({reason}): free some space "
                             "(each checkpoint holds the adapters, heads and optimiser "
                             "states)") from None
        if error.errno == errno.EDQUOT:
            raise SetupError(f"{flag}: disk quota exceeded ({reason})") from None
        raise SetupError(
            f"{flag} is not writable ({reason}): choose a folder you can write to") from None


def check_run_files(output_dir: Path, names: Sequence[str]) -> None:
    """SetupError when one of the files the run writes in `output_dir` (`names`) is there as
    anything but a regular file of one name: a symbolic or hard link (the file it shares would be
    written), a folder, a pipe. Checked before any model is built; what is there is left as it
    is."""
    for name in names:
        path = output_dir / name
        try:
            kind = file_kind(os.lstat(path))
        except FileNotFoundError:
            continue
        except OSError as error:
            raise SetupError(f"{path} cannot be checked ({error.strerror or error})") from None
        if kind is not None:
            raise SetupError(f"{path} is {kind}, not a regular file of one name: the run writes "
                             f"its {name} there and never writes through a link or into anything "
                             "else; move it away, or choose another --output-dir")


def lock_output_dir(output_dir: Path) -> FileLock | None:
    """Lock the run's folder for this process (`run_claim.lock_run_folder`; hand the lock to the
    trainer, `trainer.output_lock`, which keeps it while the run lasts), or SetupError naming the
    live run that holds it. Under a launcher only rank 0, the process that writes the folder, takes
    it; the others get None."""
    if not is_rank_zero():
        return None
    try:
        return lock_run_folder(output_dir)
    except FolderInUse as error:
        raise SetupError(str(error)) from None


#: run.json's other fields a resumed run keeps: (key, types allowed besides null, those in words)
RECORD_FIELDS = (("reward_dir", str, "a folder path"), ("reward_train_pairs", int, "an int"),
                 ("prompts", dict, "an object of SHA-256s"), ("data_dir", str, "a folder path"))


def read_run_record(output_dir: Path) -> dict[str, Any]:
    """output_dir/run.json of a run to resume, checked: a JSON object with the profile's name and
    the PPO config the run was made with (SetupError naming what is missing)."""
    run_file = output_dir / RUN_FILE
    if not run_file.is_file():
        raise SetupError(f"--resume: {run_file} is missing, so the run's settings are unknown")
    try:
        record = json.loads(run_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SetupError(f"--resume: {run_file} is not valid JSON ({error})") from None
    profile = record.get("profile") if isinstance(record, dict) else None
    if not isinstance(profile, dict) or not isinstance(profile.get("name"), str):
        raise SetupError(f"--resume: {run_file} lacks the run's profile (a \"profile\" object with "
                         "a \"name\"); it was not written by this command")
    if not isinstance(record.get("ppo_config"), dict):
        raise SetupError(f"--resume: {run_file} lacks the run's PPO settings (a \"ppo_config\" "
                         "object); it was not written by this command")
    for key, kinds, expected in RECORD_FIELDS:  # kept by the resumed run's record: no wrong type
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise SetupError(
                f"--resume: {run_file}'s {key} must be {expected} or null, got "
                f"{type(value).__name__} {value!r:.60}; it was not written by this command")
    return record


def check_resume_checkpoint(output_dir: Path, run_id: str | None = None,
                            lora: Any = None) -> int:
    """The step of output_dir's latest checkpoint, once every file of it matches the SHA-256 its
    save recorded (`checkpoint_digest.verify_checkpoint`) and its trainer state reads back safely;
    SetupError naming the checkpoint, each damaged file and the newest earlier checkpoint that is
    intact, if any. A checkpoint saved before digests existed has its files read back instead, and
    rank 0 prints one line saying it could not be verified. SetupError too when the checkpoint
    names another run than `run_id` (run.json's) or its policy and value adapters have another
    LoRA shape than `lora` (the run's LoRASpec): before any model is built."""
    latest, problem = resolve_latest(output_dir)
    if problem is None:
        # nothing is loaded before its digests match
        damage, state = checkpoint_problem(latest), None
        try:  # a file forged with its digests rewritten: read safely, refused in one line
            state = load_trainer_state(latest / TRAINER_STATE_FILE) if damage is None else None
        except (OSError, ValueError) as error:
            damage = str(error)
        if state is not None:
            if unverified(latest) and is_rank_zero():
                print(f"note: {latest} has no {MANIFEST_FILE} (saved by an older version): its "
                      "files could not be verified against SHA-256 digests, only read back; "
                      "resuming from it", file=sys.stderr)
            mismatch = foreign_checkpoint_problem(latest, state, run_id)
            if mismatch is None and lora is not None:
                shape = (lora.r, lora.alpha, lora.target_modules)
                mismatch = lora_fit_problem(latest, {"policy": shape, "value": shape},
                                            f"the run's ({RUN_FILE})")
            if mismatch is not None:
                raise SetupError(f"--resume: {mismatch}")
            return state["step"]
        problem = f"checkpoint {latest} is damaged: {damage}"
    intact = [p for p in reversed(checkpoints(output_dir))
              if p != latest and checkpoint_problem(p) is None]
    if intact:
        target = output_dir / LATEST_FILE
        advice = (f"the newest intact checkpoint is {intact[0]}: write its name into {target} "
                  f"(echo {intact[0].name} > {target}) to resume from it")
    else:
        advice = ("no checkpoint of it is intact: start a new --output-dir (a run keeps its "
                  f"{DEFAULT_KEEP} newest checkpoints only)")
    raise SetupError(f"--resume: {problem}; {advice}")


def read_prompts(preferences: bool, sft: bool = False) -> dict[str, list[str]]:
    """The prompts of both splits ("train", "test"), read and checked line by line before any model
    is built; with `preferences` (the reward model is to be trained) the preference files are
    checked too; with `sft` (ptx_coef > 0) also "sft": the SFT texts (prompt + completion) the ptx
    loss trains on. SetupError naming the file and line of a bad record, a missing file or a folder
    where a file belongs."""
    try:
        if preferences:
            for split in ("train", "test"):
                load_preferences(split)
        texts = {split: load_prompts(split) for split in ("train", "test")}
        if sft:
            texts["sft"] = [record["prompt"] + record["completion"] for record in load_sft_corpus()]
        return texts
    except (ValueError, OSError) as error:  # the loaders name the file (and the line)
        raise SetupError(f"data: {error}") from None


#: The training command's flags of the PPO settings a model limits (max_length: a profile setting)
PPO_FLAGS = {"max_prompt_length": "--max-prompt-length", "max_new_tokens": "--max-new-tokens",
             "lora.r": "--lora-r", "lora.target_modules": "--lora-target-modules"}


def check_run_fits(profile: Any, config: Any, prompts: dict[str, list[str]]) -> None:
    """SetupError when this run cannot work here, found before any model is built
    (`runtime.preflight`): a device torch cannot use on this machine, settings the SFT model cannot
    hold (prompt + response beyond its positions, a LoRA rank above its hidden size, a target it
    lacks), a batch whose logits alone exceed the memory, or more evaluation prompts than the test
    file has."""
    problem = device_problem(profile.device)
    if problem is not None:
        raise SetupError(f"the {profile.name} profile's {problem}")
    problem = model_limits_problem(profile.sft_model_path, profile.max_length, config.lora,
                                   config.max_prompt_length, config.max_new_tokens, flags=PPO_FLAGS)
    # an evaluation batch holds at most n_eval_prompts rows, however large eval_batch_size is
    eval_rows = min(config.eval_batch_size, config.n_eval_prompts) if config.eval_every else 0
    rows = max(config.rollout_batch_size, eval_rows)
    problem = problem or batch_memory_problem(profile.sft_model_path, rows,
                                              config.max_new_tokens, profile.device)
    if problem is not None:
        raise SetupError(f"settings that do not fit the {profile.name} profile's SFT model or this "
                         f"machine: {problem}")
    if config.eval_every and config.n_eval_prompts > len(prompts["test"]):
        raise SetupError(
            f"n_eval_prompts {config.n_eval_prompts} exceeds the {len(prompts['test'])} prompts of "
            "prompts_test.jsonl: lower it, or pass --eval-every 0 to train without evaluations")
