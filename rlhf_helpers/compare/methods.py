"""Run one method of the comparison: PPO (ours), GRPO, RLOO or DPO (TRL's), or the best-of-n
baseline.

    run = run_method("ppo", config, profile, reward_dir, eval_prompts)      # a MethodRun
    baseline = run_best_of_n(config, profile, reward_dir, eval_prompts)     # {n: {...}}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from rlhf_helpers.compare.best_of_n import best_of_n, best_of_n_kl
from rlhf_helpers.compare.clock import PeakMemoryMeter, TrainingClock
from rlhf_helpers.compare.config import METHODS, CompareConfig
from rlhf_helpers.compare.dpo_method import dpo_pairs, run_dpo
from rlhf_helpers.compare.result import EvalSchedule, MethodRun
from rlhf_helpers.compare.trl_methods import run_trl_method
from rlhf_helpers.ppo.evaluation import evaluate_policy
from rlhf_helpers.ppo.model.build import build_shared_model
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.data import load_preferences, load_prompts
from rlhf_helpers.world.scorer import hidden_scores

#: Names in tables and legends.
LABELS = {"ppo": "PPO (critic + GAE)", "grpo": "GRPO (TRL)", "rloo": "RLOO (TRL)",
          "dpo": "DPO (TRL)"}


def check_prompt_list(name: str, prompts: Any, at_least: int, why: str = "") -> None:
    """ValueError unless `prompts` is a list (or tuple) of at least `at_least` non-empty strings."""
    if isinstance(prompts, str) or not isinstance(prompts, list | tuple):
        raise ValueError(f"{name} must be a list of prompt strings, got {type(prompts).__name__}")
    bad = next((i for i, p in enumerate(prompts) if not isinstance(p, str) or not p.strip()), None)
    if bad is not None:
        raise ValueError(f"{name}[{bad}] must be a non-empty string, got {prompts[bad]!r}")
    if len(prompts) < at_least:
        raise ValueError(f"{name} has {len(prompts)} prompt(s); at least {at_least} needed"
                         + (f" ({why})" if why else ""))


def make_judge(config: CompareConfig,
               eval_prompts: Sequence[str]) -> Callable[[Any, Any], dict[str, float]]:
    """judge(model, tokenizer): `evaluate_policy` on the first config.n_eval_prompts of
    `eval_prompts`, one fixed sampling seed, the hidden scorer as ground truth. The same for every
    method. Its row also holds "hidden_scores", the hidden score of each prompt's response (a list,
    which `MethodRun.add_evaluation` moves out of the curve)."""
    prompts = list(eval_prompts)[: config.n_eval_prompts]

    def judge(model: Any, tokenizer: Any) -> dict[str, Any]:
        scored: list[float] = []

        def hidden(prompt_texts: Sequence[str], responses: Sequence[str]) -> list[float]:
            scored[:] = hidden_scores(list(prompt_texts), list(responses))  # every prompt at once
            return list(scored)

        row: dict[str, Any] = evaluate_policy(
            model, tokenizer, prompts, max_prompt_length=config.max_prompt_length,
            max_new_tokens=config.max_new_tokens, batch_size=config.eval_batch_size,
            hidden_score_fn=hidden)
        row["hidden_scores"] = scored
        return row

    return judge


def run_ppo(config: CompareConfig, profile: Any, reward_dir: Any, train_prompts: Sequence[str],
            judge_fn: Callable[[Any, Any], dict[str, float]],
            progress: Callable[[float], None] = lambda seconds: None) -> MethodRun:
    """The course's PPO (policy + critic adapters on one base) for the config's budget (batches or
    seconds); `progress` gets the budget spent after each batch."""
    device = torch.device(profile.device)
    meter = PeakMemoryMeter(device)
    ppo_config = profile.ppo.replace(
        seed=config.seed, progress_bar=False, policy_lr=config.learning_rate,
        kl_coef=config.kl_coef, rollout_batch_size=config.samples_per_batch,
        max_prompt_length=config.max_prompt_length, max_new_tokens=config.max_new_tokens,
        lora=config.lora, eval_batch_size=config.eval_batch_size)
    torch.manual_seed(config.seed)
    model, tokenizer = build_shared_model(profile, ppo_config, reward_dir)
    trainer = PPOTrainer(ppo_config, model, tokenizer, list(train_prompts),
                         hidden_score_fn=hidden_scores)
    clock = TrainingClock(device)
    schedule = EvalSchedule.for_config(config)
    run = MethodRun(method="ppo", label=LABELS["ppo"], clock=clock.kind, memory_how=meter.how,
                    trainable_parameters=sum(p.numel() for p in model.policy_parameters()
                                             + model.value_parameters()),
                    settings={k: v for k, v in ppo_config.to_dict().items()
                              if k in ("kl_coef", "mini_batch_size", "ppo_epochs", "gamma", "lam",
                                       "policy_lr", "value_lr", "clip_eps", "whiten_advantages")})

    def evaluate() -> None:
        row = judge_fn(model, tokenizer)
        row.update(step=float(trainer.step_count), train_seconds=clock.seconds,
                   wall_seconds=clock.wall_seconds,
                   samples=float(trainer.step_count * ppo_config.rollout_batch_size))
        run.add_evaluation(row)

    evaluate()
    while not schedule.done(clock.seconds, trainer.step_count):
        with clock.running():
            trainer.step()
        progress(schedule.spent(clock.seconds, trainer.step_count))
        if schedule.due(clock.seconds, trainer.step_count) or schedule.done(clock.seconds,
                                                                            trainer.step_count):
            evaluate()
    run.peak_memory_mb = meter.rise_mb()
    run.explained_variance = [float(row["explained_variance"]) for row in trainer.history]
    return run


def run_method(method: str, config: CompareConfig, profile: Any, reward_dir: Any,
               eval_prompts: Sequence[str],
               train_prompts: Sequence[str] | None = None, progress_bar: bool = True,
               train_pairs: Sequence[dict] | None = None) -> MethodRun:
    """Train `method` ("ppo", "grpo", "rloo" or "dpo") for the config's budget (train_batches, else
    train_seconds) and judge it on `eval_prompts`; a tqdm bar counts the budget's batches or
    seconds. PPO, GRPO and RLOO sample responses to `train_prompts` (default: prompts_train.jsonl);
    DPO trains on `train_pairs` (default: preferences_train.jsonl, the reward model's pairs)."""

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(config, CompareConfig):
        raise TypeError(f"config must be a CompareConfig, got {type(config).__name__}")
    if not hasattr(profile, "device"):
        raise TypeError("profile must be a Profile (rlhf_helpers.runtime.profiles.get_profile()), "
                        f"got {profile!r}")
    check_prompt_list("eval_prompts", eval_prompts, 1)
    if method == "dpo":  # pairs, not prompts: checked (and cut to the budget) before any model
        pairs = dpo_pairs(config, train_pairs if train_pairs is not None
                          else load_preferences("train"))
    else:
        train_prompts = train_prompts if train_prompts is not None else load_prompts("train")
        # TRL's GRPO/RLOO loaders drop an incomplete batch: with fewer prompts they would train
        # nothing and return the step-0 evaluation alone, looking like the SFT model
        check_prompt_list("train_prompts", train_prompts, 1 if method == "ppo"
                          else config.prompts_per_batch, f"one {method} batch needs "
                          f"samples_per_batch / group_size = {config.prompts_per_batch}")
        train_prompts = list(train_prompts)
    judge_fn = make_judge(config, eval_prompts)
    if config.train_batches is not None:
        total, unit = config.train_batches, "batches"
    else:
        total, unit = round(config.train_seconds,
                            1), "CPU s" if torch.device(profile.device).type != "cuda" else "s"
    bar = tqdm(total=total, desc=f"{LABELS[method]:<18}", unit=unit, disable=not progress_bar,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} " + unit)

    def progress(spent: float) -> None:
        bar.update(min(spent, bar.total) - bar.n)

    try:
        if method == "ppo":
            run = run_ppo(config, profile, reward_dir, train_prompts, judge_fn, progress)
        elif method == "dpo":
            run = run_dpo(config, profile, reward_dir, pairs, judge_fn, progress)
            run.label = LABELS[method]
        else:
            run = run_trl_method(method, config, profile, reward_dir, train_prompts,
                                 judge_fn, progress)
            run.label = LABELS[method]
    finally:
        bar.close()
    run.settings["seed"] = config.seed
    # the budget: these batches, or (None) these seconds
    run.settings["train_batches"] = config.train_batches
    run.settings["train_seconds"] = config.train_seconds
    return run


@torch.no_grad()
def run_best_of_n(config: CompareConfig, profile: Any, reward_dir: Any,
                  eval_prompts: Sequence[str]) -> dict[int, dict[str, Any]]:
    """best-of-n of the SFT model for every n in config.best_of (one draw of max(n) samples per
    prompt): {n: {"hidden", "reward", "kl", "hidden_se", "seconds", "hidden_scores"}}; kl is the
    analytic log n - (n - 1)/n, seconds the time of the draw (for all n at once, in the clock's
    unit), hidden_scores the hidden score of each prompt's pick (a list)."""
    check_prompt_list("eval_prompts", eval_prompts, 1)
    prompts = list(eval_prompts)[: config.n_eval_prompts]
    check_prompt_list("eval_prompts[:config.n_eval_prompts]", prompts, 2,
                      "the standard error of a mean needs two samples")
    ppo_config = profile.ppo.replace(seed=config.seed, lora=config.lora)
    model, tokenizer = build_shared_model(profile, ppo_config, reward_dir)
    clock = TrainingClock(model.device)
    with clock.running():
        result = best_of_n(model, tokenizer, prompts, max(config.best_of),
                           max_new_tokens=config.max_new_tokens,
                           max_prompt_length=config.max_prompt_length, seed=config.seed,
                           batch_size=config.eval_batch_size)
    rows = {}
    for n in config.best_of:
        picks = result.pick(n)[:, None]  # (N, 1)
        chosen = result.hidden_scores.gather(1, picks)[:, 0]  # (N,) hidden score of each pick
        rows[n] = {"hidden": result.hidden_mean(n), "reward": result.reward_mean(n),
                   "kl": best_of_n_kl(n), "hidden_se": float(chosen.std() / len(chosen) ** 0.5),
                   "seconds": clock.seconds, "hidden_scores": chosen.tolist()}
    return rows
