"""The update of one PPO minibatch: the clipped policy step and the clipped value step.

    mb = trim_minibatch(batch, rows)                      # the rows, without all-padding columns
    stats = policy_step(model, mb, config, policy, step)  # L = L_clip - c_ent * H (+ c_ptx * L_lm)
    stats = value_step(model, mb, config, value, step)    # L_V = mean max((V - R)^2, (V_clip - R)^2) / 2

Each loss is computed and back-propagated with its own adapter active, so no adapter switch happens
between a forward and its backward. `policy` and `value` are `optim.AdapterOptimizer`s: the
all-reduce, loss scaling, clipping and NaN checks of a step live there, the maths here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhf_helpers.core.losses import policy_loss, value_loss
from rlhf_helpers.core.masked import masked_mean
from rlhf_helpers.ppo.config import PPOConfig
from rlhf_helpers.ppo.experience import Experience
from rlhf_helpers.ppo.guards import check_all_finite, collective_stop, non_finite_stops_run
from rlhf_helpers.ppo.optim import AdapterOptimizer
from rlhf_helpers.ppo.shared_model import SharedLoRAModel


@dataclass
class Minibatch:
    """The rows of one minibatch, cut to the columns where at least one of them has a real token."""

    sequences: torch.Tensor  #: (b, p + r) prompt then response ids
    attention_mask: torch.Tensor  #: (b, p + r) 1 on real tokens
    context_length: int  #: p, prompt width after the cut
    mask: torch.Tensor  #: (b, r) 1 on real response tokens
    old_logprobs: torch.Tensor  #: (b, r) log-probs of the policy that sampled
    old_values: torch.Tensor  #: (b, r) values of the rollout
    advantages: torch.Tensor  #: (b, r)
    returns: torch.Tensor  #: (b, r)


def trim_minibatch(batch: Experience, rows: torch.Tensor) -> Minibatch:
    """The experience rows `rows`, without the columns that are padding in every one of them.

    A minibatch's longest prompt and longest response are often shorter than the whole batch's.
    Dropping all-padding columns changes no real token's output: the ones on the left are masked
    keys (position ids are counted over real tokens), the ones on the right come after every real
    token in causal attention, and every per-token quantity there has mask 0.
    """
    attn = batch.attention_mask[rows]  # (b, P + R)
    P = batch.context_length
    real = attn.bool().any(dim=0)  # (P + R,)
    first = min(int(real.int().argmax()), P - 1)  # keep the last prompt column: it predicts token 0
    last = max(attn.shape[1] - 1 - int(real.flip(0).int().argmax()), P)  # at least one response column
    r = last + 1 - P
    return Minibatch(
        sequences=batch.sequences[rows, first : last + 1], attention_mask=attn[:, first : last + 1],
        context_length=P - first, mask=batch.mask[rows, :r], old_logprobs=batch.old_logprobs[rows, :r],
        old_values=batch.values[rows, :r], advantages=batch.advantages[rows, :r],
        returns=batch.returns[rows, :r])


def policy_step(model: SharedLoRAModel, mb: Minibatch, config: PPOConfig, optimizer: AdapterOptimizer,
                step: int, train: bool = True,
                ptx_loss: Callable[[], torch.Tensor] | None = None) -> dict[str, float]:
    """One policy-adapter step on a minibatch: L = L_clip - c_ent * H + c_ptx * L_lm.

    `train=False` (the value warm-up) computes and reports the loss without stepping. `ptx_loss`
    gives the next-token loss on a fresh minibatch of SFT texts (used when config.ptx_coef > 0).
    """
    stats: dict[str, float] = {}
    # all processes agree before the gradient all-reduce; a NonFiniteError of the maths core anywhere
    # in the block counts as a NaN stop too
    with collective_stop(optimizer.accelerator), non_finite_stops_run(step):
        # without an entropy bonus the entropy is only reported: no backward through it
        logp, entropy = model.policy_logprobs(
            mb.sequences, mb.attention_mask, mb.context_length, with_entropy=True,
            entropy_grad=config.entropy_coef > 0, temperature=config.temperature)  # (b, r), (b, r)
        pg_loss, pg_stats = policy_loss(logp.float(), mb.old_logprobs, mb.advantages, mb.mask,
                                        clip_eps=config.clip_eps)
        mean_entropy = masked_mean(entropy.float(), mb.mask)
        loss = pg_loss - config.entropy_coef * mean_entropy
        if config.ptx_coef > 0 and ptx_loss is not None:
            ptx = ptx_loss()
            loss = loss + config.ptx_coef * ptx
            stats["ptx_loss"] = float(ptx.detach())
        check_all_finite("policy loss", loss.detach(), step)
    # value warm-up: the critic learns the returns first, the policy waits
    norm = optimizer.backward_and_step(loss, step) if train else 0.0
    stats.update({
        "policy_loss": float(pg_loss.detach()), "clipfrac": float(pg_stats["clipfrac"]),
        "approx_kl": float(pg_stats["approx_kl"]), "policy_grad_norm": norm,
        "entropy_update": float(mean_entropy.detach()),
        "ratio_mean": float(pg_stats["ratio_mean"]), "ratio_max": float(pg_stats["ratio_max"]),
    })
    return stats


def value_step(model: SharedLoRAModel, mb: Minibatch, config: PPOConfig, optimizer: AdapterOptimizer,
               step: int) -> dict[str, float]:
    """One critic step: L_V = mean max((V - R)^2, (clip(V, V_old +- eps_v) - R)^2) / 2, times c_vf."""
    # all processes agree before the gradient all-reduce (as in policy_step)
    with collective_stop(optimizer.accelerator), non_finite_stops_run(step):
        new_values = model.values(mb.sequences, mb.attention_mask, mb.context_length).float()  # (b, r)
        check_all_finite("values", new_values.detach() * mb.mask, step)
        v_loss, v_stats = value_loss(new_values, mb.old_values, mb.returns, mb.mask,
                                     clip_range=config.value_clip)
        check_all_finite("value loss", v_loss.detach(), step)
    norm = optimizer.backward_and_step(config.vf_coef * v_loss, step)
    return {"value_loss": float(v_loss.detach()), "vf_clipfrac": float(v_stats.get("vf_clipfrac", 0.0)),
            "value_grad_norm": norm}
