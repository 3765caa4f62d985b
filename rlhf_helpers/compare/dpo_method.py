"""DPO through TRL 1.16's own `DPOTrainer`, in the comparison's setting.

    run = run_dpo(config, profile, reward_dir, pairs, judge)

The policy is a fresh LoRA adapter (the comparison's rank, alpha and modules) on the profile's SFT
model, given to TRL as `peft_config`, so TRL takes the reference by disabling the adapter, as the
other methods do. DPO samples nothing and calls no reward function: it trains on preference pairs,
those of data/preferences_train.jsonl that notebook 02's reward model learned from. The judge is the
others' (`trl_methods.copy_policy_adapter` into a second copy of the SFT model that carries the
learned reward adapter, then `evaluate_policy`), so DPO is judged on its own samples like them.

The budget: a "batch" of DPO is samples_per_batch responses of the data set (samples_per_batch / 2
pairs), trained in updates_per_batch optimiser steps: the optimiser steps, and the responses per
step, of GRPO and RLOO. Its beta is config.kl_coef: the beta of the KL-regularised objective whose
optimum DPO fits (notebook 07, section 3).
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PrinterCallback

from rlhf_helpers.compare.clock import PeakMemoryMeter, TrainingClock
from rlhf_helpers.compare.config import CompareConfig
from rlhf_helpers.compare.result import EvalSchedule, MethodRun
from rlhf_helpers.compare.trl_methods import (
    UNBOUNDED_STEPS,
    budget_callback,
    copy_policy_adapter,
    policy_state,
    train_quietly,
)
from rlhf_helpers.ppo.model.adapters import lora_config, uses_conv1d
from rlhf_helpers.ppo.model.build import build_shared_model
from rlhf_helpers.ppo.model.samples import tokenize_prompts
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.models import load_causal_lm

#: The fields of a preference pair (data/preferences_train.jsonl; TRL's explicit-prompt format).
PAIR_FIELDS = ("prompt", "chosen", "rejected")
#: The DPOConfig arguments a run records in `MethodRun.settings`.
RECORDED_SETTINGS = ("beta", "loss_type", "per_device_train_batch_size", "learning_rate",
                     "max_length")


def pairs_per_step(config: CompareConfig) -> int:
    """Preference pairs per DPO optimiser step: the responses of one GRPO/RLOO minibatch, in
    pairs."""
    responses = config.samples_per_batch // config.updates_per_batch
    if responses % 2:
        raise ValueError(f"samples_per_batch / updates_per_batch ({config.samples_per_batch} / "
                         f"{config.updates_per_batch}) must be even for DPO: two responses a pair")
    return responses // 2


def dpo_pairs(config: CompareConfig, pairs: Any) -> list[dict]:
    """`pairs` checked ({"prompt", "chosen", "rejected"} strings, at least one optimiser step's
    worth) and, for a budget in batches, cut to the pairs it trains on: one pass over the first
    train_batches x samples_per_batch / 2 (TRL then tokenises only those)."""
    per_step = pairs_per_step(config)
    if isinstance(pairs, str | dict) or not isinstance(pairs, list | tuple):
        raise ValueError(
            f"train_pairs must be a list of preference pairs, got {type(pairs).__name__}")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, dict) or not all(
                isinstance(pair.get(key), str) and pair[key].strip() for key in PAIR_FIELDS):
            raise ValueError(f"train_pairs[{i}] must be a dict of non-empty strings "
                             f"{PAIR_FIELDS}, got {pair!r:.120}")
    if len(pairs) < per_step:
        raise ValueError(f"train_pairs has {len(pairs)} pair(s); at least {per_step} needed (one "
                         "DPO step: samples_per_batch / updates_per_batch responses, two a pair)")
    if config.train_batches is None:
        return list(pairs)
    return list(pairs[: config.train_batches * config.updates_per_batch * per_step])


def dpo_arguments(config: CompareConfig, device: torch.device, dtype: torch.dtype,
                  output_dir: str) -> Any:
    """TRL's DPOConfig for the comparison: the sigmoid (DPO) loss at beta = config.kl_coef, constant
    learning rate, no checkpoints or logging, dropout and gradient checkpointing off."""
    # trl is heavy and optional: imported only to train
    from trl import DPOConfig

    with warnings.catch_warnings():
        # transformers >= 5.23 renames gradient_checkpointing (TRL's configs default it to True)
        warnings.simplefilter("ignore", FutureWarning)
        return DPOConfig(
            output_dir=output_dir, seed=config.seed, data_seed=config.seed,
            per_device_train_batch_size=pairs_per_step(config), gradient_accumulation_steps=1,
            max_length=config.max_prompt_length + config.max_new_tokens, loss_type=["sigmoid"],
            beta=config.kl_coef, learning_rate=config.learning_rate, lr_scheduler_type="constant",
            warmup_steps=0, max_grad_norm=1.0, max_steps=UNBOUNDED_STEPS, logging_strategy="no",
            save_strategy="no", report_to="none", disable_tqdm=True, disable_dropout=True,
            gradient_checkpointing=False, use_cpu=device.type != "cuda",
            bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, dataloader_num_workers=0)


def dpo_trainer(args: Any, config: CompareConfig, policy: Any, tokenizer: Any,
                pairs: Sequence[dict]) -> Any:
    """TRL's DPOTrainer of `policy` with a fresh LoRA adapter of the comparison's shape, on `pairs`
    ({"prompt", "chosen", "rejected"} each)."""
    # trl and datasets (which comes with it) are heavy and optional: imported only to train
    from datasets import Dataset
    from datasets.utils import logging as datasets_logging  # its bars, quietened while TRL maps
    from trl import DPOTrainer  # trl: see above

    lora = config.lora
    peft_config = lora_config(lora.r, lora.alpha, lora.target_modules, uses_conv1d(policy))
    columns = {key: [pair[key] for pair in pairs] for key in PAIR_FIELDS}
    bars = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()  # TRL tokenises the pairs with a bar per pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TRL's notes on defaults it changes for a PEFT model
            return DPOTrainer(model=policy, args=args, processing_class=tokenizer,
                              peft_config=peft_config, train_dataset=Dataset.from_dict(columns))
    finally:
        if bars:
            datasets_logging.enable_progress_bar()


def run_dpo(config: CompareConfig, profile: Any, reward_dir: Any, pairs: Sequence[dict],
            judge_fn: Callable[[Any, Any], dict[str, float]],
            progress: Callable[[float], None] = lambda spent: None) -> MethodRun:
    """Train DPO with TRL on `pairs` for the config's budget (batches or seconds); judge it with
    `judge_fn(judge_model, tokenizer)` before training and at every evaluation mark. `pairs`:
    `dpo_pairs`'s."""
    per_step = pairs_per_step(config)
    device = torch.device(profile.device)
    meter = PeakMemoryMeter(device)
    torch.manual_seed(config.seed)
    judge_config = profile.ppo.replace(seed=config.seed, lora=config.lora)
    judge, tokenizer = build_shared_model(profile, judge_config, reward_dir)
    policy = load_causal_lm(profile)
    clock = TrainingClock(device)
    schedule = EvalSchedule.for_config(config)
    run = MethodRun(method="dpo", label="DPO", clock=clock.kind, memory_how=meter.how)
    with tempfile.TemporaryDirectory(prefix="rlhf-dpo-") as output_dir:
        args = dpo_arguments(config, device, policy.dtype, output_dir)
        trainer = dpo_trainer(args, config, policy, tokenizer, pairs)
        run.trainable_parameters = sum(p.numel() for p in trainer.model.parameters()
                                       if p.requires_grad)

        def evaluate() -> None:
            copy_policy_adapter(trainer.model, judge)
            row = judge_fn(judge, tokenizer)
            step = trainer.state.global_step
            row.update(step=float(step), train_seconds=clock.seconds,
                       wall_seconds=clock.wall_seconds, samples=float(2 * per_step * step))
            run.add_evaluation(row)

        evaluate()  # before training: the fresh adapter is the SFT model
        trainer.add_callback(budget_callback(clock, schedule, evaluate, progress,
                                             lambda step: step // config.updates_per_batch))
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-training summary dict
        train_quietly(trainer)
    run.policy_state = policy_state(trainer.model)
    run.peak_memory_mb = meter.rise_mb()
    run.settings = {k: v for k, v in args.to_dict().items() if k in RECORDED_SETTINGS}
    run.settings["pairs"] = len(pairs)
    return run


def _response_batch(tokenizer: Any, responses: Sequence[str], pad_id: int,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids of each response followed by EOS, and their mask: (b, R) each."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
           for text in responses]
    shape = (len(ids), max(len(row) for row in ids))
    response = torch.full(shape, pad_id, dtype=torch.long)  # (b, R)
    mask = torch.zeros(shape, dtype=torch.long)  # (b, R) 1 on the response's tokens, EOS included
    for row, row_ids in enumerate(ids):
        response[row, : len(row_ids)] = torch.tensor(row_ids)
        mask[row, : len(row_ids)] = 1
    return response, mask


@torch.no_grad()
def implicit_rewards(model: SharedLoRAModel, tokenizer: Any, pairs: Sequence[dict], beta: float,
                     max_prompt_length: int, batch_size: int = 256) -> dict[str, torch.Tensor]:
    """DPO's implicit reward beta * (log pi(y|x) - log pi_ref(y|x)) of each pair's chosen and
    rejected response (`model`'s policy adapter against its base), and the reward adapter's score
    of the same sequences: {"implicit_chosen", "implicit_rejected", "reward_chosen",
    "reward_rejected"}, (N,) float32 each, on the CPU. A response is read as DPOTrainer trains on
    it: the prompt's ids, then the response's and EOS."""
    out: dict[str, list[torch.Tensor]] = {f"{kind}_{side}": [] for kind in ("implicit", "reward")
                                          for side in ("chosen", "rejected")}
    for first in range(0, len(pairs), batch_size):
        part = list(pairs[first : first + batch_size])
        prompt_ids, prompt_mask = tokenize_prompts(tokenizer, [p["prompt"] for p in part],
                                                   max_prompt_length, model.device)  # (b, P)
        for side in ("chosen", "rejected"):
            response, mask = _response_batch(tokenizer, [p[side] for p in part],
                                             model.pad_token_id)  # (b, R)
            seq = torch.cat([prompt_ids, response.to(model.device)], dim=1)  # (b, P + R)
            attention = torch.cat([prompt_mask, mask.to(model.device)], dim=1)  # (b, P + R)
            P = prompt_ids.shape[1]
            log_ratio = (model.policy_logprobs(seq, attention, P).float()
                         - model.ref_logprobs(seq, attention, P).float())  # (b, R)
            sequence = (log_ratio * mask.to(log_ratio.device)).sum(dim=1)  # (b,) log pi/pi_ref
            out[f"implicit_{side}"].append(beta * sequence.cpu())
            out[f"reward_{side}"].append(model.reward_scores(seq, attention).float().cpu())  # (b,)
    return {key: torch.cat(parts) for key, parts in out.items()}
