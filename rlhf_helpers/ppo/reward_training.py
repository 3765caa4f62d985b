"""The reward model: TRL's RewardTrainer with a LoRA adapter (task SEQ_CLS) on the SFT base.

    result = train_reward_model(profile, "runs/reward")   # writes the adapter and its score head
    shared = SharedLoRAModel(base_lm, ..., reward_dir="runs/reward")

Loss (Bradley-Terry): -log sigmoid(r(prompt, chosen) - r(prompt, rejected)), r read at the last real
token (TRL appends EOS to each response, so the score sits on the EOS, as in PPO's rollouts).
The folder holds peft's `adapter_config.json` / `adapter_model.safetensors` and, separately,
`score_head.safetensors` with the scalar head (a plain head needs its own save).
COURSE_SPEC pitfall: RewardConfig defaults to bf16 and gradient checkpointing; on a CPU both are off
and `use_cpu=True`.
Precision: the sequence classifier is loaded in float32 whatever the profile's dtype, so the trained
LoRA matrices and the score head (`modules_to_save`) are float32 master weights; on CUDA the
arithmetic runs under autocast in the profile's dtype (`precision.amp_flags`: bf16, or fp16 with a
gradient scaler on a T4). A bf16 score head would round most of its Adam updates away.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlhf_helpers.data import data_fingerprint
from rlhf_helpers.ppo.shared_model import (
    ADAPTER_WEIGHTS_FILE,
    SCORE_HEAD_FILE,
    lora_config,
    uses_conv1d,
)


@dataclass
class RewardTrainingConfig:
    """Settings of one reward-model run; `from_profile` takes the profile's reward_* sizes."""

    batch_size: int = 32  #: preference pairs per optimiser step
    epochs: float = 2.0  #: passes over the training pairs
    learning_rate: float = 2e-3  #: AdamW learning rate of the LoRA matrices and the score head
    max_length: int = 64  #: pairs whose prompt + response is longer are dropped by TRL
    lora_r: int = 8  #: LoRA rank of the reward adapter
    lora_alpha: int = 16  #: LoRA alpha (scale alpha / r)
    lora_target_modules: tuple[str, ...] = ("c_attn", "c_proj", "c_fc")  #: module names LoRA wraps
    max_train_pairs: int | None = None  #: use only the first this many training pairs (None: all)
    seed: int = 0  #: seed of initialisation and data order

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_length", "lora_r"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("epochs", "learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def from_profile(cls, profile: Any, **overrides: Any) -> RewardTrainingConfig:
        values = dict(batch_size=profile.reward_batch_size, epochs=profile.reward_epochs,
                      learning_rate=profile.reward_lr, max_length=profile.max_length,
                      lora_r=profile.lora_r, lora_alpha=profile.lora_alpha,
                      lora_target_modules=tuple(profile.lora_target_modules), seed=profile.seed)
        values.update(overrides)
        return cls(**values)


def _score_head_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The trained score head (a modules_to_save copy inside the peft model)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model)
    head = {key.rsplit(".", 1)[1]: value.detach().cpu().float().contiguous()
            for key, value in state.items() if ".score." in key and "lora_" not in key}
    if "weight" not in head:
        raise RuntimeError("the trained reward model has no score head in its adapter state")
    return head


@torch.no_grad()
def score_pairs(model: Any, tokenizer: Any, prompts: Sequence[str], responses: Sequence[str],
                batch_size: int = 256) -> torch.Tensor:
    """Reward of each prompt + response (+ EOS, as TRL trained it) under a sequence classifier: (N,)."""
    if len(prompts) != len(responses):
        raise ValueError(f"prompts and responses must have the same length, got {len(prompts)} and "
                         f"{len(responses)}")
    device = next(model.parameters()).device
    out = []
    for first in range(0, len(prompts), batch_size):
        texts = [p + r + tokenizer.eos_token for p, r in
                 zip(prompts[first : first + batch_size], responses[first : first + batch_size], strict=True)]
        enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left").to(device)
        position_ids = (enc["attention_mask"].cumsum(1) - 1).clamp(min=0)  # (b, L)
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                       position_ids=position_ids).logits  # (b, 1)
        out.append(logits[:, 0].float().cpu())
    return torch.cat(out)  # (N,)


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation: cov(x, y) / (std x std y)."""
    a = torch.tensor(list(x), dtype=torch.float64)
    b = torch.tensor(list(y), dtype=torch.float64)
    if a.shape != b.shape or a.numel() < 2:
        raise ValueError(f"x and y must be equally long with at least 2 values, got {a.numel()} and {b.numel()}")
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / math.sqrt(float((a * a).sum() * (b * b).sum())))


def evaluate_reward_model(model: Any, tokenizer: Any, pairs: Sequence[dict]) -> dict[str, float]:
    """Held-out pairwise accuracy, the annotator's ceiling on these pairs, and the correlation of the
    learned score with the hidden ground-truth score over every chosen and rejected response."""
    from rlhf_helpers.losses import pairwise_accuracy
    from rlhf_helpers.world import Annotator, accuracy_ceiling, hidden_scores

    prompts = [p["prompt"] for p in pairs]
    chosen = score_pairs(model, tokenizer, prompts, [p["chosen"] for p in pairs])  # (N,)
    rejected = score_pairs(model, tokenizer, prompts, [p["rejected"] for p in pairs])  # (N,)
    hidden = hidden_scores(prompts + prompts, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
    annotator = Annotator()
    ceiling = accuracy_ceiling(annotator.probability(p["prompt"], p["chosen"], p["rejected"]) for p in pairs)
    return {
        "pairwise_accuracy": float(pairwise_accuracy(chosen, rejected)),
        "annotator_ceiling": ceiling,
        "score_hidden_correlation": pearson(torch.cat([chosen, rejected]).tolist(), hidden),
        "n_pairs": float(len(pairs)),
    }


def train_reward_model(profile: Any = None, output_dir: str | Path = "runs/reward",
                       config: RewardTrainingConfig | None = None,
                       train_pairs: Sequence[dict] | None = None,
                       eval_pairs: Sequence[dict] | None = None) -> dict[str, float]:
    """Train the reward adapter with TRL's RewardTrainer, save it to output_dir, return held-out metrics."""
    import tempfile
    import time

    from datasets import Dataset
    from peft import get_peft_model
    from safetensors.torch import save_file
    from trl import RewardConfig, RewardTrainer

    from rlhf_helpers._compat import checkpointing_off
    from rlhf_helpers.data import load_preferences
    from rlhf_helpers.models import load_sequence_classifier, load_tokenizer
    from rlhf_helpers.precision import MASTER_DTYPE_NAME, amp_flags
    from rlhf_helpers.profiles import get_profile

    profile = profile or get_profile()
    config = config or RewardTrainingConfig.from_profile(profile)
    train_pairs = list(train_pairs if train_pairs is not None else load_preferences("train"))
    if config.max_train_pairs is not None:
        train_pairs = train_pairs[: config.max_train_pairs]
    eval_pairs = list(eval_pairs if eval_pairs is not None else load_preferences("test"))
    if not train_pairs:
        raise ValueError("train_pairs must not be empty")

    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(profile)
    # float32 masters: the profile's dtype is the autocast dtype of the arithmetic (amp_flags below)
    base = load_sequence_classifier(profile.replace(dtype=MASTER_DTYPE_NAME), num_labels=1)
    peft_config = lora_config(config.lora_r, config.lora_alpha, config.lora_target_modules,
                              fan_in_fan_out=uses_conv1d(base), task_type="SEQ_CLS")
    peft_config.modules_to_save = ["score"]
    model = get_peft_model(base, peft_config)
    on_cpu = profile.device == "cpu"
    with tempfile.TemporaryDirectory() as scratch:
        args = RewardConfig(
            output_dir=scratch, per_device_train_batch_size=config.batch_size,
            num_train_epochs=config.epochs, learning_rate=config.learning_rate,
            max_length=config.max_length, seed=config.seed, data_seed=config.seed,
            use_cpu=on_cpu, **amp_flags(profile),  # {"bf16": ..., "fp16": ...}: autocast on CUDA only
            **checkpointing_off(RewardConfig),  # RewardConfig's default True breaks adapter switching later
            report_to=[], save_strategy="no", logging_strategy="epoch",  # a progress bar, one log line per epoch
            disable_tqdm=False,
            dataloader_num_workers=0, dataset_num_proc=None,
        )
        start = time.perf_counter()
        trainer = RewardTrainer(model=model, args=args, processing_class=tokenizer,
                                train_dataset=Dataset.from_list(list(train_pairs)))
        trainer.train()
        seconds = time.perf_counter() - start
    model = trainer.model.eval()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output_dir))
    save_file(_score_head_state(model), str(output_dir / SCORE_HEAD_FILE))
    if not (output_dir / ADAPTER_WEIGHTS_FILE).is_file():
        raise RuntimeError(f"peft did not write {ADAPTER_WEIGHTS_FILE} into {output_dir}")
    metrics = evaluate_reward_model(model, tokenizer, eval_pairs)
    metrics["train_seconds"] = seconds
    metrics["train_pairs"] = float(len(train_pairs))
    return metrics


#: Environment variable naming the folder of cached runs (default: runs/ at the repository root).
RUNS_DIR_ENV = "RLHF_RUNS_DIR"
#: File written last into a cached reward folder: its presence means the folder is complete.
COMPLETE_MARKER = "COMPLETE.json"


def runs_dir() -> Path:
    """$RLHF_RUNS_DIR if set, else `runs/` at the repository root."""
    override = os.environ.get(RUNS_DIR_ENV)
    return Path(override) if override else Path(__file__).resolve().parents[2] / "runs"


#: The data files a reward adapter is trained and measured on (under rlhf_helpers.data.data_dir()).
REWARD_DATA_FILES = ("preferences_train.jsonl", "preferences_test.jsonl")


#: Files of a model folder without a completion marker that identify its weights (the shipped tiny model).
_MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin")


def model_fingerprint(directory: str | Path) -> str:
    """SHA-256 of what identifies a model folder's content, whatever its path: its COMPLETE.json (a
    cached SFT folder: its settings, its data's checksums and its files' sizes) if it has one, else
    its config and weight files (the shipped tiny model). A hub id or a missing folder: the string."""
    directory = Path(directory)
    if not directory.is_dir():
        return str(directory)
    marker = directory / COMPLETE_MARKER
    files = [marker] if marker.is_file() else sorted(
        p for p in directory.iterdir() if p.is_file() and p.suffix in _MODEL_FILE_SUFFIXES)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + _sha256(path).encode())
    return digest.hexdigest()


def reward_cache_key(profile: Any, config: RewardTrainingConfig | None = None) -> dict[str, Any]:
    """What decides the trained adapter: the SFT model's content (not its path: a moved checkout or
    another runs folder reuses the cache), every training setting and the preference data's content."""
    import dataclasses

    config = config or RewardTrainingConfig.from_profile(profile)
    values = dataclasses.asdict(config)
    values["lora_target_modules"] = list(config.lora_target_modules)
    return {"sft_model_path": str(profile.sft_model_path),  # recorded for people; not compared
            "sft_model": model_fingerprint(profile.sft_model_path), "config": values,
            "data": data_fingerprint(REWARD_DATA_FILES)}


def reward_cache_dir(profile: Any = None, config: RewardTrainingConfig | None = None,
                     root: str | Path | None = None) -> Path:
    """Folder of the cached reward adapter: root/reward-<profile>, or reward-<profile>-<hash> when
    `config` differs from the profile's defaults (so a shrunken quick run never replaces the real one);
    "-random-init" follows the profile name when the SFT base has random weights (`Profile.random_init`)."""

    from rlhf_helpers.profiles import get_profile

    profile = profile or get_profile()
    config = config or RewardTrainingConfig.from_profile(profile)
    root = Path(root) if root is not None else runs_dir()
    name = f"reward-{profile.name}" + ("-random-init" if getattr(profile, "random_init", False) else "")
    if config != RewardTrainingConfig.from_profile(_defaults_of(profile)):
        key = json.dumps(reward_cache_key(profile, config), sort_keys=True)
        name += "-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    return root / name


def _defaults_of(profile: Any) -> Any:
    """The named profile without any overrides (the reference for `reward_cache_dir`'s plain name)."""
    from rlhf_helpers.profiles import gpu_profile, tiny_profile

    return tiny_profile() if profile.name == "tiny" else gpu_profile()


#: The files of a reward folder whose SHA-256 the completion marker records (and checks).
CHECKED_FILES = ("adapter_config.json", ADAPTER_WEIGHTS_FILE, SCORE_HEAD_FILE)
#: Temporary training folders of `ensure_reward_model`: .tmp-reward-<name>-<pid> next to the cache.
_TMP_PATTERN = re.compile(r"^\.tmp-(reward-.+)-(\d+)$")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_completion_marker(directory: Path) -> tuple[Any, str | None]:
    """(the parsed COMPLETE.json of a cached folder, None), or (None, why it cannot be read)."""
    if not directory.is_dir():
        return None, "the folder does not exist"
    marker = directory / COMPLETE_MARKER
    if not marker.is_file():
        return None, f"{COMPLETE_MARKER} is missing (an interrupted or older run)"
    try:
        return json.loads(marker.read_text(encoding="utf-8")), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"{COMPLETE_MARKER} is unreadable ({type(error).__name__})"


def reward_dir_problem(directory: str | Path, key: dict[str, Any] | None = None) -> str | None:
    """What is wrong with a cached reward folder, in a few words, or None if it is complete and intact.

    Complete: the completion marker (written last) is JSON and records the SHA-256 of each of
    CHECKED_FILES, and every one of them is there with that checksum. A truncated or overwritten
    adapter, a garbage score head or a broken adapter_config.json no longer matches its checksum.
    With `key` (`reward_cache_key`: SFT model, settings and data), the marker must also record that
    key: a folder trained on other data, settings or another SFT model is not the one asked for.
    """
    directory = Path(directory)
    record, problem = read_completion_marker(directory)
    if problem is not None:
        return problem
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or set(files) != set(CHECKED_FILES):
        return f"{COMPLETE_MARKER} has no checksums of {', '.join(CHECKED_FILES)}"
    for name in CHECKED_FILES:
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            digest = _sha256(path)
        except OSError as error:
            return f"{name} is unreadable ({error.strerror or type(error).__name__})"
        if digest != files[name]:
            return f"{name} does not match the checksum in {COMPLETE_MARKER}"
    if key is not None:  # intact: but is it the model asked for?
        for part, what in (("data", "on other data (a data file changed, or $RLHF_DATA_DIR points elsewhere)"),
                           ("sft_model", "on another SFT model (it was fine-tuned again)"),
                           ("config", "with other settings")):
            if record.get(part) != json.loads(json.dumps(key[part])):
                return f"it was trained {what}"
    return None


def is_cached_reward_model(profile: Any = None, config: RewardTrainingConfig | None = None,
                           root: str | Path | None = None) -> bool:
    """True when `ensure_reward_model(profile, config, root)` would load its folder without training."""
    from rlhf_helpers.profiles import get_profile

    profile = profile or get_profile()
    config = config or RewardTrainingConfig.from_profile(profile)
    return is_complete_reward_dir(reward_cache_dir(profile, config, root), reward_cache_key(profile, config))


def is_complete_reward_dir(directory: str | Path, key: dict[str, Any] | None = None) -> bool:
    """True when `directory` holds a finished, intact reward adapter (for `key`, if given; see
    `reward_dir_problem`)."""
    return reward_dir_problem(directory, key) is None


def _pid_is_alive(pid: int) -> bool:
    """Whether a process with this id exists (POSIX signal 0: checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def remove_dead_temporary_folders(root: str | Path, pattern: re.Pattern[str] = _TMP_PATTERN) -> list[Path]:
    """Delete the .tmp-reward-*-<pid> folders in `root` whose process no longer exists; return them.

    `pattern` matches other temporary folders instead (group 2: the PID; the SFT cache uses it).

    A run killed mid-training (kill -9, a closed notebook, a power cut) never reaches its `finally`
    and leaves its temporary folder behind. Folders of live processes are kept (another run may be
    training right now), and so is everything else in `root`. A PID reused by an unrelated process
    only keeps a dead folder a little longer. Nothing is removed on Windows, where signal 0 does
    not test a process.
    """
    root = Path(root)
    if os.name == "nt" or not root.is_dir():
        return []
    removed = []
    for folder in sorted(root.iterdir()):
        match = pattern.match(folder.name)
        if match and folder.is_dir() and not _pid_is_alive(int(match.group(2))):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def ensure_reward_model(profile: Any = None, config: RewardTrainingConfig | None = None,
                        root: str | Path | None = None) -> Path:
    """The trained reward adapter of `profile`, trained first if it is not cached yet.

    The folder is `reward_cache_dir(profile, config, root)` (default runs/reward-<profile>/). Training
    writes into a hidden temporary folder, adds the completion marker (with the held-out metrics
    and the SHA-256 of each file) last, and only then renames the folder into place, so an
    interrupted run never leaves a folder that looks complete. A cached folder whose marker is
    missing or whose files do not match their checksums is trained again into place, with one line
    on stderr saying why. Temporary folders of killed runs are removed first. The SFT model it starts
    from is prepared first (`hub_sft.ensure_sft_model`: nothing in the tiny profile, cached on a GPU).
    """
    from rlhf_helpers.profiles import get_profile
    from rlhf_helpers.world.hub_sft import ensure_sft_model

    profile = profile or get_profile()
    config = config or RewardTrainingConfig.from_profile(profile)
    ensure_sft_model(profile)  # the base the adapter trains on (gpu profile: fine-tuned once, cached)
    final = reward_cache_dir(profile, config, root)
    removed = remove_dead_temporary_folders(final.parent)
    if removed:
        print(f"removed {len(removed)} temporary reward folder(s) of runs that no longer exist: "
              f"{', '.join(p.name for p in removed)}", file=sys.stderr, flush=True)
    key = reward_cache_key(profile, config)
    problem = reward_dir_problem(final, key)
    if problem is None:
        return final
    if final.exists():
        state = "out of date" if problem.startswith("it was trained") else "damaged"
        print(f"reward cache {final} is {state} ({problem}): training it again", file=sys.stderr, flush=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        metrics = train_reward_model(profile, tmp, config)
        files = {name: _sha256(tmp / name) for name in CHECKED_FILES}
        marker = {"metrics": metrics, **key, "files": files}
        (tmp / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if final.exists():  # a damaged, outdated or incomplete leftover (or a racing writer's folder)
            if is_complete_reward_dir(final, key):
                shutil.rmtree(tmp, ignore_errors=True)
                return final
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def reward_metrics(directory: str | Path) -> dict[str, float]:
    """The held-out metrics stored in a cached reward folder's completion marker."""
    marker = Path(directory) / COMPLETE_MARKER
    if not marker.is_file():
        raise FileNotFoundError(f"{directory} has no {COMPLETE_MARKER}: not a complete reward folder")
    return json.loads(marker.read_text())["metrics"]


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """CLI: python -m rlhf_helpers.ppo.reward_training --profile tiny --out runs/reward"""
    import argparse

    from rlhf_helpers.profiles import get_profile

    parser = argparse.ArgumentParser(description="Train the reward-model LoRA adapter with TRL.")
    parser.add_argument("--profile", default=None, help="tiny, gpu or auto (default: $RLHF_PROFILE or tiny)")
    parser.add_argument("--out", default="runs/reward", help="output folder of the adapter and score head")
    parser.add_argument("--max-train-pairs", type=int, default=None)
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)
    config = RewardTrainingConfig.from_profile(profile, max_train_pairs=args.max_train_pairs)
    metrics = train_reward_model(profile, args.out, config)
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
