"""The four replaceable pieces of PPO's maths: plain functions of tensors that `PPOTrainer` takes as arguments.

    trainer = PPOTrainer(config, model, tokenizer, prompts)                              # the library's pieces
    trainer = PPOTrainer(config, model, tokenizer, prompts, advantage_fn=my_gae_loop,
                         policy_loss_fn=my_clipped_loss)                                  # yours drive training

Each piece is called with positional arguments, in this order (tensors (B, T), `mask` 1 on real tokens):

    shape_rewards_fn(scores, logprobs, ref_logprobs, mask, kl_coef)    -> rewards, or (rewards, kl)
    advantage_fn(rewards, values, mask, gamma, lam)                     -> (advantages, returns)
    policy_loss_fn(logprobs, old_logprobs, advantages, mask, clip_eps)  -> loss, or (loss, stats)
    value_loss_fn(values, old_values, returns, mask, clip_range)        -> loss, or (loss, stats)

The library's own (`core.kl.shape_rewards` with the config's kl_kind and score_clip, `core.gae.compute_gae`,
`core.losses.policy_loss`, `core.losses.value_loss`) are the defaults, also when a piece is given as None.
config.kl_kind and config.score_clip configure the library's shaping only: a shaping function of yours
gets kl_coef and does the rest itself. A piece that returns a bare loss or bare rewards, or stats
without some of the metrics, still gets every metric: what is missing (clipfrac, approx_kl, ratio_mean,
ratio_max, vf_clipfrac; the per-token KL) is measured by the library's function on the same inputs,
without gradient, so the curves of a learner's loss and of the library's are read the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlhf_helpers.core.kl import kl_estimate
from rlhf_helpers.core.losses import policy_loss, value_loss

#: shape_rewards_fn(scores (B,), logprobs, ref_logprobs, mask, kl_coef) -> rewards (B, T) or (rewards, kl)
ShapeRewardsFn = Callable[..., Any]
#: advantage_fn(rewards, values, mask, gamma, lam) -> (advantages (B, T), returns (B, T))
AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
#: policy_loss_fn(logprobs, old_logprobs, advantages, mask, clip_eps) -> loss, or (loss, stats)
PolicyLossFn = Callable[..., Any]
#: value_loss_fn(values, old_values, returns, mask, clip_range) -> loss, or (loss, stats)
ValueLossFn = Callable[..., Any]


#: the stats of a policy loss that the trainer logs, and of a value loss
POLICY_STATS = {"clipfrac", "approx_kl", "ratio_mean", "ratio_max"}
VALUE_STATS = {"vf_clipfrac"}


def check_piece(name: str, fn: Any) -> None:
    """ValueError naming the argument unless `fn` is callable (None: the library's piece)."""
    if fn is not None and not callable(fn):
        raise ValueError(f"{name} must be a function (or None for the library's), got {type(fn).__name__}")


def rewards_and_kl(out: Any, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                   mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A shaping function's result as (rewards, kl): its own kl, or the k1 estimate when it returned rewards."""
    if isinstance(out, tuple):
        return out
    return out, kl_estimate(logprobs, ref_logprobs, "k1") * mask  # (B, T)


def policy_loss_and_stats(out: Any, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                          mask: torch.Tensor, clip_eps: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A policy loss function's result as (loss, stats): its own stats, completed by the library loss's
    (measured without gradient on the same inputs) when it returned a bare loss or left some out."""
    loss, stats = out if isinstance(out, tuple) else (out, {})
    if POLICY_STATS <= stats.keys():
        return loss, stats
    with torch.no_grad():
        return loss, {**policy_loss(logprobs.detach(), old_logprobs, advantages, mask, clip_eps)[1], **stats}


def value_loss_and_stats(out: Any, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                         mask: torch.Tensor, clip_range: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A value loss function's result as (loss, stats), as `policy_loss_and_stats`."""
    loss, stats = out if isinstance(out, tuple) else (out, {})
    if VALUE_STATS <= stats.keys():
        return loss, stats
    with torch.no_grad():
        return loss, {**value_loss(values.detach(), old_values, returns, mask, clip_range)[1], **stats}
