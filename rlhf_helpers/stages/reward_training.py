"""Training the reward model: TRL's RewardTrainer with a LoRA adapter (task SEQ_CLS) on the SFT
base.

    result = train_reward_model(profile, "runs/reward")   # writes the adapter and its score head
    shared = SharedLoRAModel(base_lm, ..., reward_dir="runs/reward")

Loss (Bradley-Terry): -log sigmoid(r(prompt, chosen) - r(prompt, rejected)), r read at the last real
token (TRL appends EOS to each response, so the score sits on the EOS, as in PPO's rollouts).
The folder holds peft's `adapter_config.json` / `adapter_model.safetensors` and, separately,
`score_head.safetensors` with the scalar head (a plain head needs its own save).
A known pitfall: RewardConfig defaults to bf16 and gradient checkpointing; on a CPU both are off
and `use_cpu=True`.
Precision: the sequence classifier is loaded in float32 whatever the profile's dtype, so the trained
LoRA matrices and the score head (`modules_to_save`) are float32 master weights; on CUDA the
arithmetic runs under autocast in the profile's dtype (`precision.amp_flags`: bf16, or fp16 with a
gradient scaler on a T4). A bf16 score head would round most of its Adam updates away.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model, get_peft_model_state_dict
from safetensors.torch import save_file

from rlhf_helpers.core.losses import pairwise_accuracy
from rlhf_helpers.ppo.model.adapters import (
    ADAPTER_WEIGHTS_FILE,
    SCORE_HEAD_FILE,
    lora_config,
    uses_conv1d,
)
from rlhf_helpers.ppo.model.fused_lora import fuse_lora_layers, fuse_tanh_gelu
from rlhf_helpers.runtime.compat import checkpointing_off
from rlhf_helpers.runtime.config_fields import check_field_types
from rlhf_helpers.runtime.config_limits import (
    PROFILE_LIMITS,
    check_ints_from,
    check_positive,
    check_seed,
    ints_from,
    limit_problem,
)
from rlhf_helpers.runtime.data import load_preferences
from rlhf_helpers.runtime.lora import LoRASpec, as_lora_spec
from rlhf_helpers.runtime.models import load_sequence_classifier, load_tokenizer
from rlhf_helpers.runtime.precision import MASTER_DTYPE_NAME, amp_flags
from rlhf_helpers.runtime.preflight import model_limits_problem
from rlhf_helpers.runtime.profile_fields import profile_field, profile_values
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.world import Annotator, accuracy_ceiling, hidden_scores


@dataclass
class RewardTrainingConfig:
    """Settings of one reward-model run: the profile's reward_* settings, max_length, LoRA shape and
    seed (`profile_field`: the tiny profile's by default, any profile's through `from_profile`)."""

    batch_size: int = profile_field("reward_batch_size")  #: preference pairs per optimiser step
    epochs: float = profile_field("reward_epochs")  #: passes over the training pairs
    #: AdamW learning rate of the LoRA matrices and the score head
    learning_rate: float = profile_field("reward_lr")
    #: pairs whose prompt + response is longer are dropped by TRL
    max_length: int = profile_field("max_length")
    #: rank, alpha and targets of the reward adapter (the profile's)
    lora: LoRASpec = profile_field("lora")
    max_train_pairs: int | None = None  #: use only the first this many training pairs (None: all)
    seed: int = profile_field("seed")  #: seed of initialisation and data order, in [0, MAX_SEED]

    def __post_init__(self) -> None:
        self.lora = as_lora_spec(self.lora)
        # exact types first (a bool or "4" is never read as a number), then ranges, naming the field
        check_field_types(self, expected={"max_train_pairs": ints_from(1, optional=True)})
        check_ints_from(self, 1, ("batch_size", "max_length"))
        check_positive(self, ("epochs", "learning_rate"))
        # the profile's ranges
        for name, limit in (("epochs", "reward_epochs"), ("learning_rate", "reward_lr")):
            if (problem := limit_problem(name, getattr(self, name),
                                         PROFILE_LIMITS[limit])) is not None:
                raise ValueError(problem)
        check_ints_from(self, 1, ("max_train_pairs",), optional=True)
        check_seed(self)  # transformers' set_seed hands it to numpy, which takes no other

    @classmethod
    def from_profile(cls, profile: Any, **overrides: Any) -> RewardTrainingConfig:
        """The reward-model run of `profile`, with `overrides` (a mapping for lora changes the
        profile's spec: {"r": 4} keeps its targets)."""
        return cls(**profile_values(cls, profile, overrides))


def _score_head_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The trained score head (a modules_to_save copy inside the peft model)."""
    state = get_peft_model_state_dict(peft_model)
    head = {key.rsplit(".", 1)[1]: value.detach().cpu().float().contiguous()
            for key, value in state.items() if ".score." in key and "lora_" not in key}
    if "weight" not in head:
        raise RuntimeError("the trained reward model has no score head in its adapter state")
    return head


@torch.no_grad()
def score_pairs(model: Any, tokenizer: Any, prompts: Sequence[str], responses: Sequence[str],
                batch_size: int = 256) -> torch.Tensor:
    """Reward of each prompt + response (+ EOS, as TRL trained it) under a sequence classifier:
    (N,)."""
    if len(prompts) != len(responses):
        raise ValueError(f"prompts and responses must have the same length, got {len(prompts)} and "
                         f"{len(responses)}")
    device = next(model.parameters()).device
    out = []
    for first in range(0, len(prompts), batch_size):
        texts = [p + r + tokenizer.eos_token for p, r in
                 zip(prompts[first : first + batch_size],
                     responses[first : first + batch_size], strict=True)]
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
        raise ValueError(
            f"x and y must be equally long with at least 2 values, got {a.numel()} and {b.numel()}")
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / math.sqrt(float((a * a).sum() * (b * b).sum())))


def evaluate_reward_model(model: Any, tokenizer: Any, pairs: Sequence[dict]) -> dict[str, float]:
    """Held-out pairwise accuracy, the annotator's ceiling on these pairs, and the correlation of
    the learned score with the hidden ground-truth score over every chosen and rejected response."""
    prompts = [p["prompt"] for p in pairs]
    chosen = score_pairs(model, tokenizer, prompts, [p["chosen"] for p in pairs])  # (N,)
    rejected = score_pairs(model, tokenizer, prompts, [p["rejected"] for p in pairs])  # (N,)
    hidden = hidden_scores(prompts + prompts,
                           [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
    annotator = Annotator()
    ceiling = accuracy_ceiling(
        annotator.probability(p["prompt"], p["chosen"], p["rejected"]) for p in pairs)
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
    """Train the reward adapter with TRL's RewardTrainer, save it to output_dir, return held-out
    metrics."""
    profile = profile or get_profile()
    config = config or RewardTrainingConfig.from_profile(profile)
    train_pairs = list(train_pairs if train_pairs is not None else load_preferences("train"))
    if config.max_train_pairs is not None:
        train_pairs = train_pairs[: config.max_train_pairs]
    eval_pairs = list(eval_pairs if eval_pairs is not None else load_preferences("test"))
    if not train_pairs:
        raise ValueError("train_pairs must not be empty")
    problem = model_limits_problem(profile.sft_model_path, config.max_length, config.lora)
    # before the model is built: peft's and torch's own errors name neither setting
    if problem is not None:
        raise ValueError(problem)
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(profile)
    model = reward_peft_model(profile, config)
    model, steps, seconds = run_reward_trainer(model, tokenizer, profile, config, train_pairs)
    save_reward_adapter(model, output_dir)
    metrics = evaluate_reward_model(model, tokenizer, eval_pairs)
    metrics["train_seconds"] = seconds
    seen = pairs_seen(len(train_pairs), config.batch_size, steps)
    # distinct pairs: epochs < 1 sees some
    metrics["train_pairs"] = float(min(seen, len(train_pairs)))
    metrics["pairs_seen"] = float(seen)  # with repeats: epochs x pairs
    return metrics


def reward_peft_model(profile: Any, config: RewardTrainingConfig) -> Any:
    """The profile's SFT model as a one-label sequence classifier with a fresh reward LoRA adapter
    (the score head trained in full, `modules_to_save`), in float32 master weights."""
    # float32 masters: the profile's dtype is the autocast dtype of the arithmetic (amp_flags)
    base = load_sequence_classifier(profile.replace(dtype=MASTER_DTYPE_NAME), num_labels=1)
    peft_config = lora_config(config.lora.r, config.lora.alpha, config.lora.target_modules,
                              fan_in_fan_out=uses_conv1d(base), task_type="SEQ_CLS")
    peft_config.modules_to_save = ["score"]
    fuse_tanh_gelu(base)  # gelu_new as one kernel, not eight ops: a third of the tiny forward
    model = get_peft_model(base, peft_config)
    # float32 arithmetic: each LoRA layer as one product (fused_lora.py)
    if not any(amp_flags(profile).values()):
        fuse_lora_layers(model)
    return model


def run_reward_trainer(model: Any, tokenizer: Any, profile: Any, config: RewardTrainingConfig,
                       train_pairs: Sequence[dict]) -> tuple[Any, int, float]:
    """Train `model` on the pairs with TRL's RewardTrainer (no checkpoints, a progress bar and one
    log line per epoch): the trained model in eval mode, its optimiser steps and the seconds."""
    # datasets comes with trl: imported only to train
    from datasets import Dataset

    # trl is heavy and optional (Colab ships none): imported only to train
    from trl import RewardConfig, RewardTrainer

    with tempfile.TemporaryDirectory() as scratch:
        args = RewardConfig(
            output_dir=scratch, per_device_train_batch_size=config.batch_size,
            num_train_epochs=config.epochs, learning_rate=config.learning_rate,
            max_length=config.max_length, seed=config.seed, data_seed=config.seed,
            **reward_config_kwargs(profile, logging_strategy="epoch", disable_tqdm=False),
        )
        start = time.perf_counter()
        trainer = RewardTrainer(model=model, args=args, processing_class=tokenizer,
                                train_dataset=Dataset.from_list(list(train_pairs)))
        trainer.train()
        seconds = time.perf_counter() - start
    return trainer.model.eval(), trainer.state.global_step, seconds


def save_reward_adapter(model: Any, output_dir: str | Path) -> None:
    """Write the trained reward adapter (peft's files) and its score head (`SCORE_HEAD_FILE`) into
    output_dir."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output_dir))
    save_file(_score_head_state(model), str(output_dir / SCORE_HEAD_FILE))
    if not (output_dir / ADAPTER_WEIGHTS_FILE).is_file():
        raise RuntimeError(f"peft did not write {ADAPTER_WEIGHTS_FILE} into {output_dir}")


def pairs_seen(n_pairs: int, batch_size: int, steps: int) -> int:
    """Pairs the reward trainer processed in `steps` optimiser steps (one batch each, no
    accumulation): every epoch is ceil(n / batch) batches, its last one holding the remainder."""
    per_epoch = -(-n_pairs // batch_size)
    full_epochs, extra = divmod(steps, per_epoch)
    return full_epochs * n_pairs + min(extra * batch_size, n_pairs)


def reward_config_kwargs(profile: Any = None, **overrides: Any) -> dict[str, Any]:
    """The RewardConfig arguments that set up the run for `profile`, not the learning: a dict.

        args = RewardConfig(output_dir=..., per_device_train_batch_size=32, learning_rate=2e-3,
                            **reward_config_kwargs(profile))

    - use_cpu on a CPU profile; bf16/fp16 from `precision.amp_flags` (autocast around float32
      masters in a 16-bit dtype; a CPU computes in float32 unless its profile names one; TRL's bf16
      default is wrong there);
    - activation (gradient) checkpointing off (`compat.checkpointing_off`): RewardConfig defaults it
      on, which breaks the adapter switching of the shared PPO model later;
    - report_to=[] (no tracker), save_strategy="no" (the course saves the adapter itself),
      dataloader_num_workers=0 and dataset_num_proc=None (no worker processes).
    `overrides` are added last and win (e.g. disable_tqdm=True). Imports TRL, which it needs for the
    name of the checkpointing field.
    """
    # trl is heavy and optional (Colab ships none): imported only to train
    from trl import RewardConfig

    profile = profile or get_profile()
    kwargs: dict[str, Any] = {
        "use_cpu": profile.device == "cpu",
        **amp_flags(profile),
        **checkpointing_off(RewardConfig),
        "report_to": [],
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "dataset_num_proc": None,
    }
    kwargs.update(overrides)
    return kwargs
