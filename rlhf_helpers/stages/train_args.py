"""The training command's flags, the rules between them, and its one line on Ctrl-C
(`stages.train_ppo` runs it).

    args = parse_args(["--profile", "tiny", "--missing-eos-penalty", "-1e3"])  # -1e3: a value
    check_run_flags(args)        # SetupError: --reward-train-pairs with --reward-dir
    warmup_problem(config)       # "--value-warmup-steps 5 is not below --steps 5: ..." or None
    raise Interrupted(interrupted_line(run_dir, "tiny"))  # exit 130, the checkpoint to resume from
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from rlhf_helpers.ppo.checkpoints.save_load import latest_checkpoint
from rlhf_helpers.runtime.config_fields import add_field_flags, flag_name, join_negative_values
from rlhf_helpers.runtime.config_limits import PPO_LIMITS, allowed
from rlhf_helpers.runtime.interrupt import EXIT_INTERRUPTED
from rlhf_helpers.runtime.one_line_parser import OneLineParser
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import PROFILE_NAMES
from rlhf_helpers.runtime.threads import DEFAULT_THREADS, threads_problem
from rlhf_helpers.stages.resume import ALIASES, RESUMABLE
from rlhf_helpers.stages.run_files.run_folder import SetupError
from rlhf_helpers.stages.run_files.tracking import REPORT_TO

PROG = "python -m rlhf_helpers.stages.train_ppo"

#: The command line's own defaults where they differ from the profile's, said here only: a command
#: checkpoints along the way, a library run only at the end (PPOConfig.save_every's default).
CLI_DEFAULTS = {"save_every": 10}
NOTES = {"total_steps": "default: the profile's; with --resume the run continues up to this total",
         **{name: f"default here: {value}, unless $RLHF_PROFILE_OVERRIDES sets it"
            for name, value in CLI_DEFAULTS.items()},
         "output_dir": "default: $RLHF_PROFILE_OVERRIDES' output_dir, else runs/ppo-<profile>"}

#: Exit status of an unexpected error (a bug): the process that met it prints its traceback, the
#: others a line.
EXIT_PEER_FAILED = 1
#: Exit status of a run stopped by a NaN/inf.
EXIT_NON_FINITE = 3
#: Exit status of a run stopped because a checkpoint, metrics.jsonl, curves.html or diagnosis.json
#: could not be written.
EXIT_WRITE_FAILED = 4


def _parser_and_actions() -> tuple[argparse.ArgumentParser, list[argparse.Action]]:
    parser = OneLineParser(prog=PROG, description="Shared-LoRA PPO on a course profile.")
    run = parser.add_argument_group("the run")
    actions = [
        run.add_argument("--profile", default=None, choices=PROFILE_NAMES,
                         help="tiny, gpu or auto (default: $RLHF_PROFILE or tiny)"),
        run.add_argument("--resume", action="store_true",
                         help="continue from the latest checkpoint in --output-dir, with the "
                              "settings of its run.json (only "
                              f"{', '.join(flag_name(name) for name in RESUMABLE)} may change)"),
        run.add_argument("--reward-dir", default=None,
                         help="use this trained reward folder instead of ensure_reward_model"),
        run.add_argument("--reward-train-pairs", type=int, default=None,
                         help="train the reward model on only this many pairs (quick runs; not "
                              "with --reward-dir)"),
        run.add_argument("--no-progress", dest="progress_bar", action="store_false",
                         default=argparse.SUPPRESS,
                         help="hide the progress bar (the same as --no-progress-bar)"),
        run.add_argument("--report-to", choices=REPORT_TO, default="none",
                         help="also log every step to this experiment tracker (default: none; see "
                              "docs/metrics.md)"),
        run.add_argument("--threads", type=int, default=None,
                         help=f"torch threads on the CPU (default {DEFAULT_THREADS}: the fastest "
                              "when another process shares the cores; see benchmarks/README.md)"),
    ]
    ppo = parser.add_argument_group("PPO settings", "every field of PPOConfig; a flag not given "
                                    "keeps the profile's value (and $RLHF_PROFILE_OVERRIDES')")
    ranges = {name: f"valid: {allowed(limit)}" for name, limit in PPO_LIMITS.items()}
    actions += add_field_flags(ppo, PPOConfig, aliases=ALIASES, notes={**ranges, **NOTES})
    return parser, actions


def build_parser() -> argparse.ArgumentParser:
    """The command line: the run's own flags, then one flag per PPOConfig field (help: its `#:`
    doc)."""
    return _parser_and_actions()[0]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags of `argv` (default: sys.argv[1:]); a negative number may follow its flag
    (`--kl-coef -1e3`)."""
    parser, actions = _parser_and_actions()
    args = parser.parse_args(join_negative_values(sys.argv[1:] if argv is None else argv, actions))
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.threads is not None and (problem := threads_problem(args.threads)):
        parser.error(problem)  # above the CPUs: before anything is built
    if args.reward_train_pairs is not None and args.reward_train_pairs < 1:
        parser.error(f"--reward-train-pairs must be >= 1, got {args.reward_train_pairs}")
    for flag in ("reward_dir", "output_dir"):
        value = getattr(args, flag, None)
        if value is not None and not value.strip():
            parser.error(f"{flag_name(flag)} must name a folder, got an empty path")
    return args


def check_run_flags(args: argparse.Namespace) -> None:
    """SetupError for run flags that cannot go together. A resume checks --reward-dir and
    --reward-train-pairs against its run.json instead (`resume.check_resumed_inputs`: both may
    repeat what the run recorded)."""
    if not args.resume and args.reward_dir is not None and args.reward_train_pairs is not None:
        raise SetupError(f"--reward-train-pairs {args.reward_train_pairs} applies only when the "
                         f"reward model is trained here, and --reward-dir {args.reward_dir} uses "
                         "one already trained: leave one of them out")


def warmup_problem(config: PPOConfig, source: str = "") -> str | None:
    """Why `config` would never train its policy (a value warm-up as long as the run), or None.
    `source` says where the warm-up came from when no flag gave it (a resumed run's run.json)."""
    if config.value_warmup_steps < config.total_steps:
        return None
    return (f"--value-warmup-steps {config.value_warmup_steps}{source} is not below --steps "
            f"{config.total_steps}: the first {config.value_warmup_steps} iterations train only "
            "the critic, so the policy would never train; lower the warm-up or raise --steps")


class Interrupted(SystemExit):
    """Ctrl-C ended the run: `main` prints the message as one line and the process exits
    EXIT_INTERRUPTED."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_INTERRUPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message


def interrupted_line(output_dir: Path | None, profile_name: str | None,
                     run_files: Sequence[str] = ()) -> str:
    """The one line of a run ended by Ctrl-C: the last checkpoint saved in `output_dir` and the
    command that resumes from it, or that none was saved (so the same command starts over, once the
    `run_files` found in the folder, which a new run refuses to overwrite, are out of the way)."""
    if output_dir is None:
        return "PPO interrupted (Ctrl-C) before its output folder was chosen: nothing was written"
    last = latest_checkpoint(output_dir)
    if last is None and run_files:
        return (f"PPO interrupted (Ctrl-C): no checkpoint was saved in {output_dir} yet, so there "
                f"is nothing to resume; to start over, remove its {', '.join(run_files)} and run "
                "the same command again, or choose another --output-dir")
    if last is None:
        return (f"PPO interrupted (Ctrl-C): no checkpoint was saved in {output_dir} yet, so there "
                "is nothing to resume; run the same command again to start over")
    profile = f" --profile {profile_name}" if profile_name else ""
    return (f"PPO interrupted (Ctrl-C): the last checkpoint saved is {last}; continue the run "
            f"with: {PROG}{profile} --output-dir {shlex.quote(str(output_dir))} --resume")
