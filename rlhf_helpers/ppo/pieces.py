"""The four replaceable pieces of PPO's maths: plain functions of tensors that `PPOTrainer` takes.

    trainer = PPOTrainer(config, model, tokenizer, prompts)             # the library's pieces
    trainer = PPOTrainer(config, model, tokenizer, prompts, advantage_fn=my_gae_loop,
                         policy_loss_fn=my_clipped_loss)                 # yours drive training

Each piece gets positional arguments, in this order (tensors (B, T), `mask` 1 on real tokens):

    shape_rewards_fn(scores, logprobs, ref_logprobs, mask, kl_coef)    -> rewards, or (rewards, kl)
    advantage_fn(rewards, values, mask, gamma, lam)                     -> (advantages, returns)
    policy_loss_fn(logprobs, old_logprobs, advantages, mask, clip_eps)  -> loss, or (loss, stats)
    value_loss_fn(values, old_values, returns, mask, value_clip)        -> loss, or (loss, stats)

and the whole update loop of one iteration can be replaced too:

    update_fn(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn)
        -> [(policy loss, value loss) of every minibatch, in order]

where the optimisers are plain torch optimisers over `model.policy_parameters()` and
`model.value_parameters()`, and `policy_loss_fn(logprobs, old_logprobs, advantages, mask, clip_eps)`
returns the loss alone (the run's policy loss piece; the trainer records its stats on each call).

The library's own (`core.kl.shape_rewards` with the config's kl_kind and score_clip,
`core.gae.compute_gae`, `core.losses.policy_loss`, `core.losses.value_loss`) are the defaults, also
when a piece is given as None. config.kl_kind and config.score_clip configure the library's shaping
only: a shaping function of yours gets kl_coef and does the rest itself. A piece that returns a bare
loss or bare rewards, or stats without some of the metrics, still gets every metric: what is missing
(clipfrac, approx_kl, ratio_mean, ratio_max, vf_clipfrac; the per-token KL) is measured by the
library's function on the same inputs, without gradient, so the curves of a learner's loss and of
the library's are read the same way.

Every call of a caller's piece is checked (`piece_checks`; the library's own are called as they are,
`resolve_pieces`), and a piece that breaks its contract stops the step with a PieceError naming it
and what it returned, before any optimiser steps: an error raised inside it, a tensor argument it
changed in place (the trainer's own), a result of another type, shape, dtype or device, a loss that
is not one number or carries no gradient. The library's update checks both losses of a minibatch
before either adapter steps; an `update_fn` steps where it likes. Either way one rule holds: an
update that does not finish (an error, a refusal, an `update_fn` that never steps the policy on a
gradient, Ctrl-C) leaves every adapter weight and optimiser state as before the step
(`PPOTrainer.step`, `step_undo`). An `update_fn`'s rows log the gradient norm each optimiser
stepped on as `policy_grad_norm` / `value_grad_norm` (after the loop's own clip). Each caller's
piece works on copies of the trainer's tensors (the log-probs and values that carry the graph
excepted), and `update_fn` on a copy of the batch and of the config, so no edit of theirs reaches
the run's data; an `update_fn` that changes a frozen weight (the base, the reward model) is refused.

Each piece's `Protocol` (its exact signature) is in `piece_contracts`, and each is registered there
(`PIECES`) by the `@piece(...)` on its checked call below.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from rlhf_helpers.core.gae import compute_gae
from rlhf_helpers.core.kl import kl_estimate, shape_rewards
from rlhf_helpers.core.losses import policy_loss, value_loss
from rlhf_helpers.ppo.guards import check_all_finite
from rlhf_helpers.ppo.piece_checks import (
    PieceError,
    call_piece,
    describe,
    loss_and_stats,
    rewards_result,
    tensor_pair,
)
from rlhf_helpers.ppo.piece_contracts import (
    AdvantageFn,
    LossAndStats,
    PolicyLossFn,
    ShapeRewardsFn,
    Tensors,
    UpdateFn,
    ValueLossFn,
    piece,
)
from rlhf_helpers.ppo.update_watch import UpdateWatch
from rlhf_helpers.runtime.precision import needs_grad_scaler


@dataclass(frozen=True)
class Pieces:
    """The maths of one iteration as the trainer calls them: each returns a tuple, whoever wrote it.

    The library's functions are called as they are; a caller's piece is wrapped in its `call_*`
    check, which also completes a bare result (bare rewards' k1 KL, a bare loss's stats)."""

    shape_rewards: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], Tensors]
    advantages: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, float], Tensors]
    policy_loss: Callable[
        [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], LossAndStats]
    value_loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float | None],
                         LossAndStats]
    #: the piece named in a refusal when a loss misses its adapter (None: the library's loss)
    policy_loss_name: str | None = None
    value_loss_name: str | None = None  #: the same for the value loss
    shaped_by: str = "shaped rewards"  #: what a NaN message calls the shaped rewards
    advantages_by: str = ""  #: appended to "advantages"/"returns" in a NaN message
    #: the caller's own functions by the trainer's argument name, as given: what trains the run
    given: Mapping[str, Callable[..., Any]] = field(default_factory=dict)


def resolve_pieces(kl_kind: str, score_clip: float | None, shape_rewards_fn: ShapeRewardsFn | None,
                   advantage_fn: AdvantageFn | None, policy_loss_fn: PolicyLossFn | None,
                   value_loss_fn: ValueLossFn | None) -> Pieces:
    """The pieces a trainer runs with: None or the library's function as is (`PIECES[name].library`
    in `piece_contracts`), a caller's wrapped in its checked call (`PIECES[name].call`), written out
    so that a reader (and tools/walk_iteration.py) sees what each field holds; the library's shaping
    given as a piece runs checked, without kl_kind. tests/package/test_option_names.py holds this to
    PIECES."""
    library_shaping = partial(shape_rewards, kl_kind=kl_kind, score_clip=score_clip)
    own_gae = advantage_fn is None or advantage_fn is compute_gae
    own_policy = policy_loss_fn is None or policy_loss_fn is policy_loss
    own_value = value_loss_fn is None or value_loss_fn is value_loss
    return Pieces(
        shape_rewards=(library_shaping if shape_rewards_fn is None
                       else partial(call_shape_rewards, shape_rewards_fn)),
        advantages=compute_gae if own_gae else partial(call_advantages, advantage_fn),
        policy_loss=policy_loss if own_policy else partial(call_policy_loss, policy_loss_fn),
        value_loss=value_loss if own_value else partial(call_value_loss, value_loss_fn),
        policy_loss_name=None if own_policy else "policy_loss_fn",
        value_loss_name=None if own_value else "value_loss_fn",
        shaped_by="shaped rewards" + ("" if shape_rewards_fn is None
                                      else " returned by shape_rewards_fn"),
        advantages_by="" if own_gae else " returned by advantage_fn",
        given={name: fn for name, fn, own in (
            ("shape_rewards_fn", shape_rewards_fn, shape_rewards_fn is None),
            ("advantage_fn", advantage_fn, own_gae), ("policy_loss_fn", policy_loss_fn, own_policy),
            ("value_loss_fn", value_loss_fn, own_value)) if not own})


#: the stats of a policy loss that the trainer logs, and of a value loss
POLICY_STATS = {"clipfrac", "approx_kl", "ratio_mean", "ratio_max"}
VALUE_STATS = {"vf_clipfrac"}


def check_piece(name: str, fn: Any) -> None:
    """ValueError naming the argument unless `fn` is callable (None: the library's piece)."""
    if fn is not None and not callable(fn):
        raise ValueError(
            f"{name} must be a function (or None for the library's), got {type(fn).__name__}")


def _loss_number(value: Any) -> float:
    """float(value) for a loss: a real number or a one-element tensor; True/False: TypeError."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError("a loss is a number, not a boolean")
    return float(value)


def minibatch_losses(out: Any, name: str = "update_fn") -> list[tuple[float, float]]:
    """An update function's result checked: a non-empty list of (policy loss, value loss) pairs of
    numbers (PieceError naming it otherwise)."""
    try:
        pairs = [(_loss_number(policy), _loss_number(value)) for policy, value in out]
    except (TypeError, ValueError, OverflowError, RuntimeError) as error:  # OverflowError: 10**400
        raise PieceError(
            f"{name} must return a list of (policy loss, value loss) pairs of numbers, one per "
            f"minibatch; it returned {describe(out)} ({type(error).__name__}: {error})") from None
    if not pairs:
        raise PieceError(f"{name} returned no losses: it must take at least one minibatch step")
    return pairs


def copied(value: Any) -> Any:
    """A piece's own copy of a trainer's tensor (a clone: what it does to it, `.data` and `.numpy()`
    included, reaches nothing of the trainer's); anything else as it is. The tensors are (B, T) at
    most: a few copies per iteration."""
    return value.clone() if isinstance(value, torch.Tensor) else value


@piece("shape_rewards_fn", ShapeRewardsFn, library=shape_rewards)
def call_shape_rewards(fn: ShapeRewardsFn, scores: torch.Tensor, logprobs: torch.Tensor,
                       ref_logprobs: torch.Tensor, mask: torch.Tensor,
                       kl_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A shaping function called and its result checked (`piece_checks`), as (rewards, kl): its own
    kl, or the k1 estimate when it returned rewards alone."""
    out = call_piece("shape_rewards_fn", fn,
                     *map(copied, (scores, logprobs, ref_logprobs, mask)), kl_coef)
    rewards, kl = rewards_result("shape_rewards_fn", out, like=logprobs)
    if kl is None:
        kl = kl_estimate(logprobs, ref_logprobs, "k1") * mask  # (B, T)
    return rewards, kl  # (B, T), (B, T)


@piece("advantage_fn", AdvantageFn, library=compute_gae)
def call_advantages(fn: AdvantageFn, rewards: torch.Tensor, values: torch.Tensor,
                    mask: torch.Tensor, gamma: float,
                    lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """An advantage function called and its (advantages, returns) checked (`piece_checks`)."""
    out = call_piece("advantage_fn", fn, *map(copied, (rewards, values, mask)), gamma, lam)
    return tensor_pair("advantage_fn", out, ("advantages", "returns"), like=rewards)


@piece("policy_loss_fn", PolicyLossFn, library=policy_loss)
def call_policy_loss(fn: PolicyLossFn, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                     advantages: torch.Tensor, mask: torch.Tensor,
                     clip_eps: float) -> tuple[torch.Tensor, dict[str, Any]]:
    """A policy loss function called and its result checked (`piece_checks`), as (loss, stats): its
    own stats, completed by the library loss's (measured without gradient on the same inputs) when
    it returned a bare loss or left some out."""
    inputs = (logprobs, old_logprobs, advantages, mask, clip_eps)
    # the log-probs carry the graph to the adapter: passed as they are (an in-place edit is refused
    # by `_version`); the stats measured here read a copy taken before the call, which not even an
    # edit through .data reaches
    seen = logprobs.detach().clone()  # (b, r)
    out = call_piece("policy_loss_fn", fn, logprobs, *map(copied, inputs[1:]))
    loss, stats = loss_and_stats("policy_loss_fn", out, wants_grad=logprobs.requires_grad)
    if POLICY_STATS <= stats.keys():
        return loss, dict(stats)
    with torch.no_grad():
        return loss, {**policy_loss(seen, *inputs[1:])[1], **stats}


@piece("value_loss_fn", ValueLossFn, library=value_loss)
def call_value_loss(fn: ValueLossFn, values: torch.Tensor, old_values: torch.Tensor,
                    returns: torch.Tensor, mask: torch.Tensor,
                    value_clip: float | None) -> tuple[torch.Tensor, dict[str, Any]]:
    """A value loss function called and its result checked as (loss, stats): `call_policy_loss`."""
    inputs = (values, old_values, returns, mask, value_clip)
    seen = values.detach().clone()  # (b, r): as the log-probs above
    out = call_piece("value_loss_fn", fn, values, *map(copied, inputs[1:]))
    loss, stats = loss_and_stats("value_loss_fn", out, wants_grad=values.requires_grad)
    if VALUE_STATS <= stats.keys():
        return loss, dict(stats)
    with torch.no_grad():
        return loss, {**value_loss(seen, *inputs[1:])[1], **stats}


def check_update_fn_settings(config: Any, model: Any, accelerator: Any) -> None:
    """ValueError naming the setting an `update_fn` cannot honour: it is one process's plain loop of
    the clipped policy loss and the value loss, with plain torch optimisers (no fp16 scaling)."""
    unsupported = [
        (config.entropy_coef > 0, "entropy_coef must be 0"),
        (config.ptx_coef > 0, "ptx_coef must be 0"),
        (config.value_warmup_steps > 0, "value_warmup_steps must be 0"),
        (accelerator is not None and accelerator.num_processes > 1, "it runs on one process only"),
        (needs_grad_scaler(model), "an fp16 base needs the library's loss scaling")]
    reasons = [reason for bad, reason in unsupported if bad]
    if reasons:
        raise ValueError("update_fn (your own update loop) cannot run with these settings: "
                         + "; ".join(reasons) + ". Leave update_fn out to use the library's update")


@piece("update_fn", UpdateFn, library=None)  # the library's own: `iteration.update`
def run_update_fn(update_fn: UpdateFn, policy_loss_fn: PolicyLossFn, model: Any, batch: Any,
                  policy_opt: Any, value_opt: Any, config: Any, generator: torch.Generator,
                  step: int) -> list[dict[str, float]]:
    """One iteration's update by `update_fn`; returns the stats of each minibatch (its two losses,
    the policy loss's stats when it called `policy_loss_fn` once per minibatch, and the gradient
    norms its optimisers stepped on). NonFiniteStop on a NaN loss; PieceError naming the piece that
    failed, changed the batch in place, returned what the trainer cannot use, or (update_fn) never
    stepped the policy. The caller (`PPOTrainer.update`) puts the weights and optimiser states
    back when anything escapes this function (`step_undo`): no half-applied step."""
    recorded: list[dict[str, float]] = []

    def loss_only(logprobs, old_logprobs, advantages, mask, clip_eps):
        loss, stats = call_policy_loss(policy_loss_fn, logprobs.float(), old_logprobs,
                                       advantages, mask, clip_eps)
        recorded.append({key: float(value) for key, value in stats.items()})
        return loss

    # its own batch (tensors cloned) and config: what it changes there reaches neither the trainer's
    # batch (the metrics, `last_batch`) nor its config (every later step)
    fields = {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}
    mine = dataclasses.replace(batch, **{
        key: copied(value) if isinstance(value, torch.Tensor) else copy.copy(value)
        for key, value in fields.items()})
    with UpdateWatch(policy_opt, value_opt, model) as watch:
        out = call_piece("update_fn", update_fn, model, mine, policy_opt, value_opt,
                         copy.deepcopy(config), generator, loss_only)
        losses = minibatch_losses(out)
        check_all_finite("update_fn's losses", torch.tensor(losses, dtype=torch.float64), step)
        watch.check_frozen_unchanged()
        watch.check_policy_trained(step)
    stats = [{"policy_loss": policy, "value_loss": value} for policy, value in losses]
    if len(recorded) == len(stats):  # one policy loss per minibatch: its stats belong to the curves
        stats = [{**row, **extra} for row, extra in zip(stats, recorded, strict=True)]
    for key in ("policy", "value"):
        norms = watch.grad_norms(key)
        if norms:  # one step per minibatch: its norm; else each row gets the update's mean
            per_row = norms if len(norms) == len(stats) else [sum(norms) / len(norms)] * len(stats)
            stats = [{**row, f"{key}_grad_norm": norm}
                     for row, norm in zip(stats, per_row, strict=True)]
    return stats


def mean_update_stats(rows: list[dict[str, float]]) -> dict[str, float]:
    """The mean over an update's minibatches of each stat (the per-minibatch-only ones left out),
    and the first minibatch's mean ratio as `first_ratio` (1 up to rounding when the old log-probs
    are right)."""
    skip = ("epoch", "minibatch", "ratio_mean", "ratio_max")
    means = {key: sum(row[key] for row in rows) / len(rows) for key in rows[0] if key not in skip}
    if "ratio_mean" in rows[0]:
        means["first_ratio"] = rows[0]["ratio_mean"]
    return means
