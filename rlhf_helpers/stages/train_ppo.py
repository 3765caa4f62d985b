"""Command line: train the shared-LoRA PPO policy of a profile, with checkpoints, metrics, curves.

    python -m rlhf_helpers.stages.train_ppo --profile tiny --steps 60 --output-dir runs/ppo-tiny
    python -m rlhf_helpers.stages.train_ppo --output-dir runs/ppo-tiny --steps 80 --resume
    accelerate launch -m rlhf_helpers.stages.train_ppo --profile gpu       # several GPUs

Two CPU processes (gloo; `--cpu --num_processes 2` silently starts ONE; torchrun works too):
`accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no
--dynamo_backend no -m rlhf_helpers.stages.train_ppo`. A NaN/inf on one stops all, each exit 3.

What it does: ensures the profile's SFT model and reward model (`ensure_sft_model`,
`ensure_reward_model`: trained once, cached in runs/ or $RLHF_CACHE_DIR), builds the shared model,
runs `run_loop.train_loop` under an `accelerate.Accelerator`, and writes into --output-dir (locked
for the run: a second live run into it exits 2, naming this one's pid):

    step-NNNNNN/, latest    atomic checkpoints (ppo/checkpoints/save_load.py)
    metrics.jsonl           one JSON object of metrics per PPO step (docs/metrics.md)
    curves.html             the main curves, the doctor's findings marked (a browser, offline)
    diagnosis.json          the run doctor's findings (`stages.diagnose`; also printed on stderr)
    run.json                the profile, the PPO config and the reward folder of this run
    tracking/               with --report-to tensorboard|wandb: the same metrics, TRL-style names
Settings: every PPOConfig field is a flag (`--help`); a flag not given keeps the profile's value,
each number within a range float32 can hold (`runtime.config_limits`). $RLHF_PROFILE_OVERRIDES
sets the profile for every stage; the flags win over it. --resume continues with what run.json
records (the profile, the PPO settings, the reward model, the prompts' SHA-256); only
--total-steps (--steps), --save-every, --eval-every and the progress bar may change
(`stages/resume.py`). Exit status: 0 done; 2 a bad argument or a run that cannot start, one line
on stderr, found before any model is built where it can be (`stages/train_setup.py`,
`stages/run_files/run_folder.py`, `runtime/preflight.py`), or a lock, a checkpoint not matching
its digests, a GGUF file cut short found later; 3 stopped by a NaN/inf, the last good checkpoint
kept; 4 a run file could not be written (a full disk is named; the previous checkpoint kept,
metrics.jsonl never logs a step whose checkpoint failed), or --output-dir removed or moved mid-run;
130 Ctrl-C, one line naming the last checkpoint and the command that resumes from it."""

from __future__ import annotations

# ruff: noqa: E402 - run as a command, Ctrl-C is one line from here on, so the imports below (seconds) come after
if __name__ == "__main__":
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt()

import argparse
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlhf_helpers.core.checks import NonFiniteError
from rlhf_helpers.doctor import compute_record
from rlhf_helpers.ppo.checkpoints.ownership import RunFolderGone
from rlhf_helpers.ppo.checkpoints.run_identity import run_id_to_continue
from rlhf_helpers.ppo.checkpoints.save_load import (
    CheckpointDamagedError,
    CheckpointMismatchError,
    CheckpointSaveError,
    disk_problem,
    latest_checkpoint,
    load_checkpoint,
)
from rlhf_helpers.ppo.guards import PeerProcessFailed, stopped_its_peers
from rlhf_helpers.ppo.metrics import append_jsonl, write_replacing
from rlhf_helpers.ppo.model.build import build_shared_model
from rlhf_helpers.ppo.run_loop import train_loop
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.artifacts import runs_dir
from rlhf_helpers.runtime.config_fields import given_field_values
from rlhf_helpers.runtime.interrupt import is_rank_zero, raised_by_ctrl_c, restore_interrupt
from rlhf_helpers.runtime.locks import FolderInUse
from rlhf_helpers.runtime.models import model_folder_problem
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import env_overrides, get_profile
from rlhf_helpers.runtime.threads import use_threads
from rlhf_helpers.runtime.weights import IncompleteGGUFFile, require_weights
from rlhf_helpers.stages.diagnose import write_verdict
from rlhf_helpers.stages.resume import (
    flag_error,
    run_record,
)
from rlhf_helpers.stages.reward import ensure_reward_model
from rlhf_helpers.stages.reward_training import RewardTrainingConfig
from rlhf_helpers.stages.run_files.run_folder import (
    EXIT_SETUP,
    RUN_FILE,
    SetupError,
    check_output_dir,
    check_run_fits,
    lock_output_dir,
    read_prompts,
)
from rlhf_helpers.stages.run_files.tracking import (
    check_tracker,
    log_metrics,
    make_accelerator,
    start_tracking,
)
from rlhf_helpers.stages.sft import ensure_sft_model
from rlhf_helpers.stages.train_args import (
    CLI_DEFAULTS,
    EXIT_NON_FINITE,
    EXIT_PEER_FAILED,
    EXIT_WRITE_FAILED,
    PROG,
    Interrupted,
    build_parser,
    check_run_flags,
    interrupted_line,
    parse_args,
    warmup_problem,
)
from rlhf_helpers.stages.train_setup import (
    METRICS_FILE,
    check_folder_holds,
    check_reward_dir,
    resumed_settings,
    run_files_in,
    warn_unknown_tokens,
)
from rlhf_helpers.world.scorer import hidden_scores

#: Errors of a run that cannot go on, past the flags' checks: a lock held or unusable
#: (LockFileUnusable is a FolderInUse), a checkpoint not matching its digests or not fitting the
#: run, a GGUF file cut short. `main` prints one line, exits 2.
USER_ERRORS = (FolderInUse, CheckpointDamagedError, CheckpointMismatchError, IncompleteGGUFFile)
#: what this module offers besides `main` and `run`: the parser lives in `stages.train_args`
__all__ = ["PROG", "USER_ERRORS", "build_parser", "main", "parse_args", "run"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run; returns a summary (last metrics, checkpoint path, output folder). Ctrl-C
    raises Interrupted, whose line names the last checkpoint and the command that resumes from
    it."""
    check_run_flags(args)
    # one unless --threads says otherwise (runtime/threads.py)
    use_threads(getattr(args, "threads", None))
    try:
        profile = get_profile(args.profile)
    except (ValueError, TypeError) as error:  # a bad $RLHF_PROFILE / $RLHF_PROFILE_OVERRIDES
        raise SetupError(str(error)) from None
    try:
        # offline with no GGUF file: how to get it, before anything is built
        require_weights(profile.weights)
    except FileNotFoundError as error:
        raise SetupError(f"the gpu profile's weights: {error}") from None
    # the flag, else the overrides'
    chosen_dir = getattr(args, "output_dir", None) or profile.ppo.output_dir
    output_dir = Path(chosen_dir) if chosen_dir else runs_dir() / f"ppo-{profile.name}"
    # the PPO flags given
    given = {**given_field_values(args, PPOConfig), "output_dir": str(output_dir)}
    # the command line's own defaults, unless $RLHF_PROFILE_OVERRIDES sets the field
    defaults = {name: value for name, value in CLI_DEFAULTS.items() if name not in env_overrides()}
    try:  # before the folder is touched; a resumed run checks its flags against run.json below
        config = None if args.resume else profile.ppo.replace(**{**defaults, **given})
    # a setting no run can use (a flag's, or the profile's)
    except (TypeError, ValueError) as error:
        raise SetupError(flag_error(error, given, "the profile's PPO settings")) from None
    # a policy that would never train
    if config is not None and (problem := warmup_problem(config)):
        raise SetupError(problem)
    check_tracker(args.report_to, output_dir)  # before the folder is touched
    check_output_dir(output_dir)
    # first: two runs started at once cannot both pass the checks below
    folder_lock = lock_output_dir(output_dir)
    try:
        return _run_in_folder(args, profile, config, given, output_dir, folder_lock)
    # Ctrl-C: one line naming the checkpoint to resume from, not a traceback
    except KeyboardInterrupt:
        if folder_lock is not None:
            folder_lock.release()  # the folder is free for the resume at once
        raise Interrupted(interrupted_line(output_dir, profile.name,
                                           run_files_in(output_dir))) from None


def _run_in_folder(args: argparse.Namespace, profile: Any, config: PPOConfig | None,
                   given: dict[str, Any], output_dir: Path, folder_lock: Any) -> dict[str, Any]:
    """The run once its folder is locked: the checks that read the folder, the models, the training,
    the files."""
    check_folder_holds(args.resume, output_dir)
    record = None
    if args.resume:  # what run.json recorded, with only the resumable settings changed
        record, config, profile = resumed_settings(args, profile, given, output_dir)
    elif args.reward_dir is not None:
        check_reward_dir(args.reward_dir)
    # a damaged or foreign model folder: before anything is built
    problem = model_folder_problem(profile)
    if problem is not None:
        raise SetupError(f"the {profile.name} profile's SFT model: {problem}")
    # bad data: exit 2
    prompts = read_prompts(preferences=args.reward_dir is None and record is None,
                           sft=config.ptx_coef > 0)
    check_run_fits(profile, config, prompts)
    accelerator = make_accelerator(args.report_to, output_dir,
                                   cpu=not torch.cuda.is_available() or profile.device == "cpu")
    if profile.device != "cpu":  # one GPU per process under `accelerate launch`
        profile = profile.replace(device=str(accelerator.device))
    reward_dir, reward_pairs = ready_models(args, profile, record, output_dir, accelerator)
    warn_unknown_tokens(profile, prompts["train"], accelerator.is_main_process)
    torch.manual_seed(config.seed)
    model, tokenizer = build_shared_model(profile, config, reward_dir)
    model.to(accelerator.device)
    trainer = PPOTrainer(config, model, tokenizer, prompts["train"], hidden_score_fn=hidden_scores,
                         accelerator=accelerator, ptx_texts=prompts.get("sft"))
    trainer.output_lock = folder_lock  # the folder is locked once: train() keeps this lock
    if args.resume:
        loaded = load_checkpoint(trainer, output_dir)
        if accelerator.is_main_process:
            print(f"resumed from {loaded} (step {trainer.step_count})", file=sys.stderr)
    # the run's id, in run.json and every checkpoint: the resumed record's (new for an older one)
    trainer.run_id = run_id_to_continue(record)
    record = {"run_id": trainer.run_id, **run_record(
        profile, config, reward_dir, reward_pairs, accelerator.num_processes, resumed=record,
        compute=compute_record(trainer))}
    start_run_files(trainer, output_dir, record, accelerator, args.report_to)
    status = train_and_log(trainer, output_dir, accelerator,
                           prompts["test"] if config.eval_every else None)
    if accelerator.is_main_process:  # the doctor's verdict, then the curves marked with it
        status = write_verdict(trainer, output_dir, accelerator, profile.name, status)
    accelerator.wait_for_everyone()  # then every process reads the checkpoint process 0 wrote last
    trainer.close()
    if folder_lock is not None:  # the run's files are written: the folder is free for the next run
        folder_lock.release()
    return {"status": status, "steps": trainer.step_count, "output_dir": str(output_dir),
            "checkpoint": str(latest_checkpoint(output_dir)),
            "is_main_process": accelerator.is_main_process, "accelerator": accelerator,
            "last_metrics": trainer.history[-1] if trainer.history else {}}


def start_run_files(trainer: PPOTrainer, output_dir: Path, record: dict[str, Any], accelerator: Any,
                    report_to: str) -> None:
    """metrics.jsonl as the checkpoint's history says, run.json, and the tracker."""
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        # the history in the checkpoint is the truth: steps logged after it (a crash) are dropped
        append_jsonl(output_dir / METRICS_FILE, trainer.history, mode="w")
        write_replacing(output_dir / RUN_FILE, json.dumps(record, indent=2, default=str) + "\n")
    start_tracking(accelerator, report_to, output_dir, record)


def train_and_log(trainer: PPOTrainer, output_dir: Path, accelerator: Any,
                  eval_prompts: Sequence[str] | None) -> str:
    """`train_loop` with each step appended to metrics.jsonl; returns the run's status. A NaN stop
    or a failed write ends the run with its line; an error on another process ends every process
    together."""
    is_main = accelerator.is_main_process
    metrics_path = output_dir / METRICS_FILE

    def log(metrics: dict[str, float]) -> None:
        if is_main:
            try:
                append_jsonl(metrics_path, [metrics])
            except OSError as error:
                raise CheckpointSaveError(
                    f"could not append step {int(metrics['step'])} to {metrics_path}: "
                    f"{disk_problem(error, output_dir)}; {trainer.last_checkpoint or 'no'} "
                    "checkpoint is kept") from error
            log_metrics(accelerator, metrics)

    try:
        train_loop(trainer, eval_prompts=eval_prompts, callback=log)
    except NonFiniteError as error:
        if is_main:
            print(f"PPO stopped: {error}", file=sys.stderr)
        return "stopped"
    # another process met an unexpected error and prints its traceback
    except PeerProcessFailed as error:
        print(f"PPO stopped: {error}", file=sys.stderr, flush=True)
        # that process waits here too: neither exits before the other printed
        accelerator.wait_for_everyone()
        raise SystemExit(EXIT_PEER_FAILED) from None
    except KeyboardInterrupt:
        # its share of the folder's lock: `run` releases the other and prints the line
        trainer.close()
        raise
    except CheckpointSaveError as error:
        print(f"PPO stopped: {error}", file=sys.stderr)
        # a folder gone: nothing more is written there (no verdict). Several processes: only this
        # (main) one saves, the others wait in the next collective, so leave now and let the
        # launcher stop them rather than meet them at a barrier they never reach
        if accelerator.num_processes > 1 or isinstance(error, RunFolderGone):
            raise SystemExit(EXIT_WRITE_FAILED) from None
        return "write failed"
    except Exception as error:
        if raised_by_ctrl_c(error):  # a step's undo that failed on Ctrl-C: the interrupt's line
            trainer.close()
            raise KeyboardInterrupt from error
        if not stopped_its_peers(error):
            raise
        # the others raised PeerProcessFailed and print their line: print ours, then leave together,
        # so the launcher (which ends the rest once one exits) cuts neither
        traceback.print_exc()
        sys.stderr.flush()
        accelerator.wait_for_everyone()
        raise SystemExit(EXIT_PEER_FAILED) from None
    return "finished"


def ready_models(args: argparse.Namespace, profile: Any, record: dict[str, Any] | None,
                 output_dir: Path, accelerator: Any) -> tuple[Path | None, int | None]:
    """The SFT model and the reward folder, trained once and cached; returns (reward folder,
    pairs)."""
    # gpu profile: one process fine-tunes the SFT model, the others reuse it
    with accelerator.main_process_first():
        ensure_sft_model(profile)
    reward_pairs = None if args.reward_dir is not None else args.reward_train_pairs
    # the checkpoint holds the reward adapter's weights and shape: no reward folder needed
    if record is not None:
        return latest_checkpoint(output_dir), reward_pairs
    if args.reward_dir is not None:
        return Path(args.reward_dir), reward_pairs
    reward_config = RewardTrainingConfig.from_profile(profile, max_train_pairs=reward_pairs)
    with accelerator.main_process_first():  # one process trains, the others find it cached
        return ensure_reward_model(profile, reward_config), reward_pairs


def main(argv: Sequence[str] | None = None) -> int:
    try:
        # Ctrl-C raises KeyboardInterrupt again: handled below, naming the checkpoint
        restore_interrupt()
        summary = run(parse_args(argv))
    except SetupError as error:  # one line, as argparse prints its usage errors
        # every process prints it: under a launcher the first to exit has the others ended (SIGTERM)
        print(f"{PROG}: error: {error.message}", file=sys.stderr)
        raise
    except USER_ERRORS as error:  # a lock, a damaged checkpoint, a GGUF file: one line too, exit 2
        print(f"{PROG}: error: {' '.join(str(error).splitlines())}", file=sys.stderr)
        raise SystemExit(EXIT_SETUP) from None
    except (Interrupted, KeyboardInterrupt) as stop:  # Ctrl-C: one line (rank 0's), exit 130
        if not isinstance(stop, Interrupted):  # before the output folder was chosen
            stop = Interrupted(interrupted_line(None, None))
        if is_rank_zero():
            print(stop.message, file=sys.stderr, flush=True)
        raise stop from None
    accelerator = summary.pop("accelerator")
    if summary.pop("is_main_process"):
        print(json.dumps({k: v for k, v in summary.items() if k != "last_metrics"}), flush=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # no process exits (and has the launcher end the others) before that line
        torch.distributed.barrier()
    # closes the trackers (and the process group: after the last collective)
    if accelerator.log_with:
        accelerator.end_training()
    return {"stopped": EXIT_NON_FINITE, "write failed": EXIT_WRITE_FAILED}.get(summary["status"], 0)


if __name__ == "__main__":
    sys.exit(main())
