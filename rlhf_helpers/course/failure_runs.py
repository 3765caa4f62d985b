"""Notebook 06's harness: PPO variants, correct or broken on purpose, run from one saved start.

    lab = LabSizes.from_profile(profile)
    config = lab.ppo_config(profile)
    start = adapter_state(model)                            # the fresh policy and value adapters
    run = run_variant(PPOTrainer, config, model, tokenizer, prompts, lab.long_steps, start=start)
    steps, kl = series(run.history, "kl")

A broken variant is a `PPOTrainer` subclass (or a changed config) written in the notebook: the
engine has no switch for a bug. Every run first copies `start` into the shared model's adapters, so
variants differ only in what the notebook changed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from rlhf_helpers.core.kl import kl_estimate
from rlhf_helpers.core.masked import masked_sum
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.stages.reward_training import pearson
from rlhf_helpers.world.scorer import hidden_scores


@dataclass(frozen=True)
class LabSizes:
    """Sizes of the lab's runs, from a profile: a quarter of its batch, half its epochs, fewer
    steps."""

    batch: int  #: prompts per PPO step
    mini_batch: int  #: sequences per gradient step
    epochs: int  #: passes over each rollout batch
    #: steps of the runs that must over-optimise: the baseline, beta = 0, the reward-model sweep
    long_steps: int
    short_steps: int  #: steps of the pad == EOS run (b)
    ref_as_old_steps: int  #: steps of each side of (a), both started from the baseline's end
    warmup_steps: int  #: critic-only steps of the value warm-up in (e)
    critic_steps: int  #: policy updates compared in (e), with and without the warm-up
    seeds: tuple[int, ...] = (0, 1, 2)  #: sampling seeds of the runs repeated to show their spread

    @classmethod
    def from_profile(cls, profile: Any) -> LabSizes:
        """The lab of a profile (tiny: 16 prompts a step, 30 long steps, 12 short ones)."""
        ppo = profile.ppo
        batch = max(2, ppo.rollout_batch_size // 4)
        return cls(batch=batch, mini_batch=max(1, batch // 2), epochs=max(1, ppo.ppo_epochs // 2),
                   long_steps=max(2, ppo.total_steps // 2),
                   short_steps=max(2, ppo.total_steps // 5),
                   ref_as_old_steps=max(2, ppo.total_steps // 30), warmup_steps=max(
                       1, ppo.total_steps // 15), critic_steps=max(2, ppo.total_steps // 20))

    def ppo_config(self, profile: Any, **overrides: Any) -> PPOConfig:
        """The profile's PPOConfig with the lab's batch, minibatch and epochs, no progress bar."""
        values = dict(rollout_batch_size=self.batch, mini_batch_size=self.mini_batch,
                      ppo_epochs=self.epochs, progress_bar=False)
        return profile.ppo.replace(**{**values, **overrides})


def adapter_state(model: SharedLoRAModel) -> list[torch.Tensor]:
    """Copies of the policy adapter, value adapter and value head weights (a start to run from)."""
    return [p.detach().clone() for p in model.policy_parameters() + model.value_parameters()]


def load_adapter_state(model: SharedLoRAModel, state: Sequence[torch.Tensor]) -> None:
    """Copy weights saved by `adapter_state` back into the model's policy and value parameters."""
    params = model.policy_parameters() + model.value_parameters()
    if len(params) != len(state):
        raise ValueError(f"state holds {len(state)} tensors, the model has {len(params)} "
                         "policy/value parameters")
    with torch.no_grad():
        for param, saved in zip(params, state, strict=True):
            param.copy_(saved)


def step_extras(trainer: PPOTrainer) -> dict[str, Any]:
    """What the notebook reads from one finished step beyond `trainer.history`: the sampled EOS
    tokens' advantages and log-prob changes (and the other tokens' as a control), the first
    minibatch's ratio and clip fraction, and the batch's sequence KL by k1 and k3."""
    batch, model = trainer.last_batch, trainer.model
    P = batch.context_length
    real = batch.mask.bool()  # (B, R)
    is_eos = (batch.sequences[:, P:] == model.eos_token_id) & real  # (B, R): the sampled EOS tokens
    with torch.no_grad():
        new_logprobs = model.policy_logprobs(batch.sequences, batch.attention_mask,
                                             P).float()  # (B, R)
    change = new_logprobs - batch.old_logprobs  # (B, R): what this step's update did to each token
    # masked_sum, not "* mask": whatever the padding holds stays out
    seq_k1 = masked_sum(kl_estimate(batch.old_logprobs, batch.ref_logprobs, kind="k1"),
                        batch.mask, dim=1)  # (B,)
    seq_k3 = masked_sum(kl_estimate(batch.old_logprobs, batch.ref_logprobs, kind="k3"),
                        batch.mask, dim=1)  # (B,)
    first = trainer.last_update_stats[0]  # the first minibatch of the first epoch
    return {
        # advantages of the batch the trainer collected (a broken update may have seen another copy)
        "eos_advantage": batch.advantages[is_eos].tolist(), "eos_change": change[is_eos].tolist(),
        "other_advantage": batch.advantages[real & ~is_eos].tolist(),
        "other_change": change[real & ~is_eos].tolist(), "first_ratio_mean": first["ratio_mean"],
        "first_clipfrac": first["clipfrac"], "k1_mean": float(seq_k1.mean()),
        "k3_mean": float(seq_k3.mean()), "k1_negative": float((seq_k1 < 0).float().mean()),
        "k3_negative": float((seq_k3 < 0).float().mean()),
    }


@dataclass
class LabRun:
    """One finished variant: its trainer and, if asked for, `step_extras` after every step."""

    trainer: PPOTrainer  #: the trainer after its last step (history, last_batch, last_update_stats)
    #: `step_extras` of each step ([] when not asked)
    extras: list[dict[str, Any]] = field(default_factory=list)

    @property
    def history(self) -> list[dict[str, float]]:
        """The trainer's metrics, one dict per step."""
        return self.trainer.history


def run_variant(trainer_class: type[PPOTrainer], config: PPOConfig, model: SharedLoRAModel,
                tokenizer: Any, prompts: Sequence[str], steps: int, *,
                start: Sequence[torch.Tensor], desc: str = "", extras: bool = False,
                reward_fn: Callable[..., Any] | None = None, hidden_score_fn: Callable[..., Any]
                | None = hidden_scores, progress: bool = True) -> LabRun:
    """Copy `start` into the model's adapters, then train `steps` iterations of
    `trainer_class(config, ...)`.

    `extras`: also record `step_extras` after every step (one more policy forward per step).
    `reward_fn=None`: the model's reward adapter scores the responses.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    load_adapter_state(model, start)
    trainer = trainer_class(config, model, tokenizer, list(prompts), reward_fn=reward_fn,
                            hidden_score_fn=hidden_score_fn)
    run = LabRun(trainer)
    for _ in tqdm(range(steps), desc=desc, disable=not progress):
        trainer.step()
        if extras:
            run.extras.append(step_extras(trainer))
    return run


def series(history: Sequence[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric of a history."""
    return [row["step"] for row in history], [row[key] for row in history]


def seed_band(histories: Sequence[Sequence[dict[str, float]]], key: str) -> dict[str, list[float]]:
    """Mean, min and max of one metric over runs of equal length (several seeds), step by step:
    {"step", "mean", "low", "high"}, each a list of len(histories[0])."""
    if not histories or len({len(h) for h in histories}) != 1:
        raise ValueError("histories must be a non-empty list of equally long runs")
    values = torch.tensor([series(h, key)[1] for h in histories], dtype=torch.float64)  # (S, N)
    return {"step": series(histories[0], key)[0], "mean": values.mean(0).tolist(),
            "low": values.min(0).values.tolist(), "high": values.max(0).values.tolist()}


def correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation of two equally long lists (nan with fewer than 3 points)."""
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must have the same length, got {len(xs)} and {len(ys)}")
    if len(xs) < 3:
        return math.nan
    return pearson(xs, ys)


def third_stats(values: Sequence[float]) -> list[tuple[float, float]]:
    """(mean, standard error) of the first, middle and last third of a curve (a short run is noisy:
    compare thirds). The error is the spread of the third's values over sqrt(count), nan for one
    value."""
    n = len(values)
    cuts = [0, max(1, n // 3), max(2, 2 * n // 3), n]
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        part = [float(v) for v in values[a:b]]
        if not part:
            out.append((math.nan, math.nan))
            continue
        mean = sum(part) / len(part)
        spread = math.sqrt(sum((v - mean) ** 2 for v in part)
                           / (len(part) - 1)) if len(part) > 1 else math.nan
        out.append((mean, spread / math.sqrt(len(part))))
    return out
