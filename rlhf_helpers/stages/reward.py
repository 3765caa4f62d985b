"""The reward stage: the reward adapter of a profile, trained once and cached.

    folder = ensure_reward_model(profile)        # runs/reward-<profile>/, trained first if needed
    python -m rlhf_helpers.stages.reward --profile tiny --out runs/reward   # train into a folder

The command checks before it builds anything (exit 2, one line): its settings, the device, the SFT
model folder and what it can hold (`runtime.preflight`), the preference files (named with the line),
and --out, which it then locks for the run (a second run into it is refused, naming this one).
Ctrl-C: one line, exit 130, --out as it was.

The cache follows `runtime.artifacts` (completion marker written last, SHA-256 of every file, atomic
rename). Its key is what decides the adapter: the SFT model's content (not its path), every training
setting and the preference data's content, so an edited data file or a fine-tuned-again SFT model
trains again, and a moved checkout reuses the cache.
"""

from __future__ import annotations

# ruff: noqa: E402 - as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("python -m rlhf_helpers.stages.reward")

import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.runtime.artifacts import (
    COMPLETE_MARKER,
    artifact_problem,
    build_cached,
    build_lock,
    cache_dir,
    model_fingerprint,
    read_record,
    shown_path,
    unrecorded_files,
)
from rlhf_helpers.runtime.data import data_fingerprint, load_preferences
from rlhf_helpers.runtime.interrupt import one_line_interrupt
from rlhf_helpers.runtime.lock_files import FolderInUse
from rlhf_helpers.runtime.models import model_folder_problem
from rlhf_helpers.runtime.one_line_parser import OneLineParser
from rlhf_helpers.runtime.precision import amp_flags
from rlhf_helpers.runtime.preflight import base_problem, model_limits_problem
from rlhf_helpers.runtime.profiles import WEIGHTS_SUFFIX, get_profile, gpu_profile, tiny_profile
from rlhf_helpers.runtime.threads import DEFAULT_THREADS, threads_problem, use_threads
from rlhf_helpers.stages.reward_training import RewardTrainingConfig, train_reward_model
from rlhf_helpers.stages.run_files.run_folder import SetupError, check_output_dir
from rlhf_helpers.stages.sft import ensure_sft_model

#: The data files a reward adapter is trained and measured on (under
#: rlhf_helpers.runtime.data.data_dir()).
REWARD_DATA_FILES = ("preferences_train.jsonl", "preferences_test.jsonl")
#: The command's name in its messages.
PROG = "python -m rlhf_helpers.stages.reward"
#: How a reward folder trained for another key is described, by the part of the key that differs.
OUT_OF_DATE = {"data": "on other data (a data file changed, or $RLHF_DATA_DIR points elsewhere)",
               "sft_model": "on another SFT model (it was fine-tuned again)",
               "config": "with other settings",
               "autocast": "in another precision (bf16 or fp16 autocast, or none)"}


def reward_cache_key(profile: Any, config: RewardTrainingConfig | None = None) -> dict[str, Any]:
    """What decides the trained adapter: the SFT model's content (not its path: a moved checkout or
    another runs folder reuses the cache), every training setting and the preference data's
    content."""
    config = config or RewardTrainingConfig.from_profile(profile)
    values = dataclasses.asdict(config)
    values["lora"] = config.lora.to_dict()
    return {"sft_model_path": str(profile.sft_model_path),  # recorded for people; not compared
            "sft_model": model_fingerprint(profile.sft_model_path), "config": values,
            # the arithmetic's dtype: a bf16- and an fp16-autocast adapter are not one cached model
            "autocast": amp_flags(profile),
            "data": data_fingerprint(REWARD_DATA_FILES)}


def _defaults_of(profile: Any) -> Any:
    """The named profile without any overrides (the reference for `reward_cache_dir`'s plain
    name)."""
    return tiny_profile() if profile.name == "tiny" else gpu_profile()


def reward_cache_dir(profile: Any = None, config: RewardTrainingConfig | None = None,
                     root: str | Path | None = None) -> Path:
    """Folder of the cached reward adapter: root/reward-<profile>, or reward-<profile>-<hash> when
    `config` differs from the profile's defaults (so a shrunken quick run never replaces the real
    one); the weight source's suffix (`profiles.WEIGHTS_SUFFIX`: "-gguf", "-random-init") follows
    the profile name."""
    profile = profile or get_profile()
    config = config or RewardTrainingConfig.from_profile(profile)
    root = Path(root) if root is not None else cache_dir()
    name = f"reward-{profile.name}" + WEIGHTS_SUFFIX.get(getattr(profile, "weights", "hub"), "")
    if config != RewardTrainingConfig.from_profile(_defaults_of(profile)):
        key = json.dumps(reward_cache_key(profile, config), sort_keys=True)
        name += "-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    return root / name


def reward_dir_problem(directory: str | Path, key: dict[str, Any] | None = None) -> str | None:
    """What is wrong with a cached reward folder, in a few words, or None if it is complete and
    intact (`artifacts.artifact_problem`); with `key` (`reward_cache_key`) it must also have been
    trained for it: "it was trained on other data" and the like otherwise."""
    return artifact_problem(directory, key, OUT_OF_DATE)


def is_cached_reward_model(profile: Any = None, config: RewardTrainingConfig | None = None,
                           root: str | Path | None = None) -> bool:
    """True when `ensure_reward_model(profile, config, root)` would load its folder without
    training."""
    profile = profile or get_profile()
    config = config or RewardTrainingConfig.from_profile(profile)
    return reward_dir_problem(reward_cache_dir(profile, config, root),
                              reward_cache_key(profile, config)) is None


def ensure_reward_model(profile: Any = None, config: RewardTrainingConfig | None = None,
                        root: str | Path | None = None) -> Path:
    """The trained reward adapter of `profile`, trained first if it is not cached yet.

    The folder is `reward_cache_dir(profile, config, root)` (default runs/reward-<profile>/), built
    by `artifacts.build_cached`: a missing, damaged or out-of-date folder is trained again into
    place, with one line on stderr saying why. The SFT model it starts from is prepared first
    (`sft.ensure_sft_model`: nothing in the tiny profile, cached on a GPU).
    """
    profile = profile or get_profile()
    config = config or RewardTrainingConfig.from_profile(profile)
    # the base the adapter trains on (gpu profile: fine-tuned once, cached)
    ensure_sft_model(profile)
    final = reward_cache_dir(profile, config, root)

    def announce(problem: str) -> None:
        if final.exists():
            state = "out of date" if problem.startswith("it was trained") else "damaged"
            print(f"reward cache {shown_path(final)} is {state} ({problem}): training it again",
                  file=sys.stderr, flush=True)

    return build_cached(final, reward_cache_key(profile, config),
                        lambda tmp: {"metrics": train_reward_model(profile, tmp, config)},
                        describe=OUT_OF_DATE, announce=announce, family="reward-", what="reward")


def reward_metrics(directory: str | Path) -> dict[str, float]:
    """The held-out metrics stored in a cached reward folder's completion marker."""
    return read_record(directory)["metrics"]


def check_can_train(profile: Any, config: RewardTrainingConfig) -> None:
    """SetupError unless a reward model can train here, found before any model is built: a device
    torch cannot use on this machine, a damaged SFT model folder, settings it cannot hold
    (max_length beyond its positions, a LoRA rank above its hidden size, a target it lacks), or a
    bad preference file (named with its line), a GGUF weights file missing or cut short."""
    problem = base_problem(profile)  # the SFT command's check too
    if problem is not None:
        raise SetupError(problem)
    problem = model_folder_problem(profile)
    if problem is not None:
        raise SetupError(f"the {profile.name} profile's SFT model: {problem}")
    problem = model_limits_problem(profile.sft_model_path, config.max_length, config.lora)
    if problem is not None:
        raise SetupError(
            f"settings that do not fit the {profile.name} profile's SFT model: {problem}")
    try:
        for split in ("train", "test"):
            load_preferences(split)
    except (ValueError, OSError) as error:  # the loader names the file (and the line)
        raise SetupError(f"data: {error}") from None


def lock_out(out: Path) -> Any:
    """The held lock of --out (`artifacts.build_lock`, the one its build takes), or SystemExit 2
    with one line naming the live run that holds it: two runs into one folder would both train, and
    one model would be lost."""
    try:
        return build_lock(out, "reward").acquire()
    except FolderInUse as error:  # LockFileUnusable too: it says what is at the path
        print(f"{PROG}: error: --out {out}: {error}; wait for that run to end, or choose another "
              "--out", file=sys.stderr)
        raise SystemExit(2) from None


@one_line_interrupt(PROG,
                    "--out is replaced only by a complete reward model; run it again to train one")
def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """CLI: python -m rlhf_helpers.stages.reward --profile tiny --out runs/reward"""
    # its errors are one line, as the training command's
    parser = OneLineParser(prog=PROG, description="Train the reward-model LoRA adapter with TRL.")
    parser.add_argument("--profile", default=None, choices=("tiny", "gpu", "auto"),
                        help="default: $RLHF_PROFILE or tiny")
    parser.add_argument("--out", default="runs/reward",
                        help="output folder of the adapter and score head")
    parser.add_argument("--max-train-pairs", type=int, default=None,
                        help="train on the first N pairs only (N >= 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help=f"torch threads on the CPU (default {DEFAULT_THREADS}: the fastest "
                             "when another process shares the cores; see benchmarks/README.md)")
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.threads is not None and (problem := threads_problem(args.threads)):
        parser.error(problem)
    use_threads(args.threads)
    if not args.out.strip():
        parser.error("--out must name a folder, got an empty path")
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not (out / COMPLETE_MARKER).is_file():
        parser.error(f"--out {out} exists and is not a reward folder (no {COMPLETE_MARKER}); it "
                     "would be replaced, so choose a new or empty folder")
    # a reward folder with a person's files added
    if out.is_dir() and (extra := unrecorded_files(out)):
        parser.error(
            f"--out {out} holds {', '.join(extra[:3])}, which the reward command did not write; it "
            "would be replaced with the folder, so move them away or choose a new folder")
    # a bad setting, machine, model folder or data file: one line, exit 2, before a model is built
    try:
        profile = get_profile(args.profile)
        config = RewardTrainingConfig.from_profile(profile, max_train_pairs=args.max_train_pairs)
        check_can_train(profile, config)
        check_output_dir(out, flag_name="--out")
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    except SetupError as error:
        parser.error(error.message)
    metrics: dict[str, float] = {}

    def train(tmp: Path) -> dict[str, Any]:
        metrics.update(train_reward_model(profile, tmp, config))
        return {"metrics": metrics}

    with lock_out(out):  # this run's alone until its model is in place
        ensure_sft_model(profile)
        # the cache's folder layout and checksums: the PPO command's `--reward-dir` accepts it
        build_cached(out, reward_cache_key(profile, config), train, force=True)
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
