"""GRPO and RLOO through TRL 1.16's own trainers, in the comparison's setting.

    run = run_trl_method("grpo", config, profile, reward_dir, train_prompts, judge)

The policy is a fresh LoRA adapter (the comparison's rank, alpha and modules) on the profile's SFT
model, given to TRL as `peft_config`, so TRL takes the reference by disabling the adapter, as PPO
here does. The reward is `LearnedRewardFunction` on a second copy of the SFT model that carries the
learned reward adapter; that copy is also the judge: at each evaluation the policy adapter's weights
are copied into its `policy` adapter and `evaluate_policy` samples from it, as for PPO.

The trainers are subclassed only to keep what they compute: each generation batch's advantages
(the rewards are kept by the reward function), so the course can check them against
`rlhf_helpers.core.group_advantages`.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from transformers import PrinterCallback, TrainerCallback
from transformers.utils import logging as transformers_logging

from rlhf_helpers.compare.clock import PeakMemoryMeter, TrainingClock
from rlhf_helpers.compare.config import CompareConfig
from rlhf_helpers.compare.learned_reward import LearnedRewardFunction
from rlhf_helpers.compare.result import EvalSchedule, MethodRun
from rlhf_helpers.ppo.model.adapters import lora_config, uses_conv1d
from rlhf_helpers.ppo.model.build import build_shared_model
from rlhf_helpers.runtime.models import load_causal_lm

#: Steps TRL may take at most: the budget, not this, ends a run.
UNBOUNDED_STEPS = 10**7
#: The TRL arguments a run records in `MethodRun.settings`.
RECORDED_SETTINGS = ("loss_type", "scale_rewards", "beta", "num_generations",
                     "normalize_advantages", "per_device_train_batch_size", "steps_per_generation",
                     "learning_rate", "epsilon")


def trl_arguments(method: str, config: CompareConfig, device: torch.device, dtype: torch.dtype,
                  output_dir: str) -> Any:
    """TRL's GRPOConfig or RLOOConfig for the comparison (constant learning rate, no checkpoints,
    no logging, dropout and gradient checkpointing off, TRL's own progress bar off)."""
    # trl is heavy and optional (Colab ships none): imported only to train
    from trl import GRPOConfig, RLOOConfig

    common = dict(
        output_dir=output_dir, seed=config.seed, data_seed=config.seed,
        per_device_train_batch_size=config.samples_per_batch // config.updates_per_batch,
        steps_per_generation=config.updates_per_batch, gradient_accumulation_steps=1,
        num_generations=config.group_size, num_iterations=1,
        max_completion_length=config.max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=config.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, beta=config.kl_coef, max_steps=UNBOUNDED_STEPS, logging_strategy="no",
        save_strategy="no", report_to="none", disable_tqdm=True, disable_dropout=True,
        gradient_checkpointing=False, use_cpu=device.type != "cuda", bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16, dataloader_num_workers=0,
    )
    if method not in ("grpo", "rloo"):
        raise ValueError(f"method must be 'grpo' or 'rloo', got {method!r}")
    with warnings.catch_warnings():
        # transformers >= 5.23 renames gradient_checkpointing (TRL's configs default it to True);
        # the deprecated name is the one Colab's transformers 5.15 knows
        warnings.simplefilter("ignore", FutureWarning)
        if method == "grpo":
            return GRPOConfig(loss_type=config.grpo_loss_type,
                              scale_rewards=config.grpo_scale_rewards, **common)
        return RLOOConfig(normalize_advantages=False, **common)


def _recording(trainer_class: type) -> type:
    """`trainer_class` that also keeps each generation batch's advantages in
    `recorded_advantages`."""

    class Recording(trainer_class):
        recorded_advantages: list[torch.Tensor]

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.recorded_advantages.append(out["advantages"].detach().float().cpu())  # (N * G,)
            return out

    Recording.__name__ = f"Recording{trainer_class.__name__}"
    return Recording


def policy_state(trl_model: Any) -> dict[str, torch.Tensor]:
    """A detached copy of the LoRA weights TRL trains (adapter "default")."""
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(trl_model).items()}


def copy_policy_adapter(trl_model: Any, judge: Any) -> None:
    """Copy the LoRA weights TRL trains (adapter "default"; or such weights, `policy_state`'s)
    into the judge's `policy` adapter."""
    state = trl_model if isinstance(trl_model, dict) else get_peft_model_state_dict(trl_model)
    result = set_peft_model_state_dict(judge.peft, state, adapter_name="policy")
    if result.unexpected_keys or not state:
        raise ValueError(f"the TRL policy adapter does not fit the judge's policy adapter "
                         f"(unexpected {list(result.unexpected_keys)[:3]})")


def budget_callback(clock: TrainingClock, schedule: EvalSchedule, evaluate: Callable[[], None],
                     on_progress: Callable[[float], None],
                     batches_done: Callable[[int], int]) -> Any:
    class BudgetCallback(TrainerCallback):
        """Counts the training budget between evaluations; stops TRL once it is spent."""

        def on_train_begin(self, args, state, control, **kwargs):
            clock.start()

        def on_step_end(self, args, state, control, **kwargs):
            clock.stop()
            batches = batches_done(state.global_step)
            on_progress(schedule.spent(clock.seconds, batches))
            done = schedule.done(clock.seconds, batches)
            if schedule.due(clock.seconds, batches) or done:
                evaluate()
            if done:
                control.should_training_stop = True
            else:
                clock.start()
            return control

    return BudgetCallback()


def run_trl_method(method: str, config: CompareConfig, profile: Any, reward_dir: Any,
                   train_prompts: Sequence[str], judge_fn: Callable[[Any, Any], dict[str, float]],
                   progress: Callable[[float], None] = lambda seconds: None) -> MethodRun:
    """Train `method` ("grpo" or "rloo") with TRL for the config's budget (batches or seconds);
    judge it with `judge_fn(judge_model, tokenizer)` before training and at every evaluation
    mark."""
    # trl is heavy and optional (Colab ships none): imported only to train
    from trl import GRPOTrainer, RLOOTrainer

    trainer_class = _recording({"grpo": GRPOTrainer, "rloo": RLOOTrainer}[method])
    device = torch.device(profile.device)
    meter = PeakMemoryMeter(device)
    torch.manual_seed(config.seed)
    judge_config = profile.ppo.replace(seed=config.seed, lora=config.lora)
    judge, tokenizer = build_shared_model(profile, judge_config, reward_dir)
    reward_fn = LearnedRewardFunction(judge, tokenizer, config.max_prompt_length)
    policy = load_causal_lm(profile)
    clock = TrainingClock(device)
    schedule = EvalSchedule.for_config(config)
    run = MethodRun(method=method, label=method.upper(), clock=clock.kind, memory_how=meter.how)
    with tempfile.TemporaryDirectory(prefix=f"rlhf-{method}-") as output_dir:
        args = trl_arguments(method, config, device, policy.dtype, output_dir)
        trainer = trl_trainer(trainer_class, args, config, policy, tokenizer, reward_fn,
                              train_prompts)
        run.trainable_parameters = sum(p.numel() for p in trainer.model.parameters()
                                       if p.requires_grad)

        def evaluate() -> None:
            copy_policy_adapter(trainer.model, judge)
            row = judge_fn(judge, tokenizer)
            row.update(step=float(trainer.state.global_step), train_seconds=clock.seconds,
                       wall_seconds=clock.wall_seconds, samples=float(reward_fn.samples_scored))
            run.add_evaluation(row)

        evaluate()  # before training: the fresh adapter is the SFT model
        def batches_done(global_step: int) -> int:  # batches whose every update has run
            return global_step // config.updates_per_batch

        trainer.add_callback(budget_callback(clock, schedule, evaluate, progress, batches_done))
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-training summary dict
        train_quietly(trainer)
    run.policy_state = policy_state(trainer.model)
    run.rewards = list(reward_fn.rewards)
    run.advantages = list(trainer.recorded_advantages)
    run.peak_memory_mb = meter.rise_mb()
    run.settings = {k: v for k, v in args.to_dict().items() if k in RECORDED_SETTINGS}
    return run


def trl_trainer(trainer_class: type, args: Any, config: CompareConfig, policy: Any, tokenizer: Any,
                reward_fn: Any, train_prompts: Sequence[str]) -> Any:
    """TRL's trainer of `policy` with a fresh LoRA adapter of the comparison's shape
    (`peft_config`), rewarded by `reward_fn` on `train_prompts`; its `recorded_advantages` empty."""
    # datasets comes with trl: imported only to train
    from datasets import Dataset

    lora = config.lora
    peft_config = lora_config(lora.r, lora.alpha, lora.target_modules, uses_conv1d(policy))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's notes on defaults it changes for a PEFT model
        trainer = trainer_class(model=policy, reward_funcs=reward_fn, args=args,
                                processing_class=tokenizer, peft_config=peft_config,
                                train_dataset=Dataset.from_dict({"prompt": list(train_prompts)}))
    trainer.recorded_advantages = []
    return trainer


def train_quietly(trainer: Any) -> None:
    """`trainer.train()` without the warnings of TRL and transformers' decode steps."""
    verbosity = transformers_logging.get_verbosity()
    # transformers' decode step warns "no attention_mask" on left-padded batches although generate
    # keeps the mask in its cache (checked: per-step logits equal a masked full forward's)
    transformers_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
    finally:
        transformers_logging.set_verbosity(verbosity)
