"""One PPO iteration, in the order it runs: the rollout (no gradients), then the update epochs.

    batch = rollout(model, tokenizer, prompts, config, kl_coef, reward_fn, pieces)   # an Experience
    rows = update_epochs(model, batch, policy_opt, value_opt, config, generator, pieces,
                         step=step)            # one row of stats per minibatch

`PPOTrainer.step` runs the two (as cleanrl's `ppo.py` writes its loop) and turns the rows into the
step's metrics. Both are functions of what they read, passed in: no trainer, and nothing written
back. The maths are called by name: the `pieces` (reward shaping, advantages, the two losses) are
the library's `core` functions unless the caller gave their own, and the model's forwards are
methods of `SharedLoRAModel`. Around the iteration: the trainer's undo of a step that does not
finish (`step_undo`) and the run loop (`run_loop`). Inside it, called by name: the guard of each
minibatch (`guards.guard`: a NaN stops every process, a refused minibatch leaves no gradient) and
the optimisers' step with its checks (`optim`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhf_helpers.core.checks import check_no_nan
from rlhf_helpers.core.masked import masked_mean, masked_whiten
from rlhf_helpers.ppo.experience import Experience
from rlhf_helpers.ppo.guards import guard, non_finite_stops_run
from rlhf_helpers.ppo.model.samples import RewardFn, sample_responses, score_samples
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.ppo.optim import AdapterOptimizer
from rlhf_helpers.ppo.pieces import AdvantageFn, Pieces, ShapeRewardsFn, resolve_pieces
from rlhf_helpers.runtime.ppo_config import PPOConfig


@torch.no_grad()
def rollout(model: SharedLoRAModel, tokenizer, prompts: Sequence[str], config: PPOConfig,
            kl_coef: float, reward_fn: RewardFn | None, pieces: Pieces) -> Experience:
    """The experience half of one iteration, in the order it runs (no gradients). A NaN/inf stops
    it with NonFiniteError naming the first tensor holding one (the caller's guard adds the step).
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    # old log-probs: the distribution that sampled, softmax(z / T) of the policy (not the reference)
    samples = sample_responses(model, tokenizer, prompts, config.max_prompt_length,
                               config.max_new_tokens, temperature=config.temperature,
                               with_logprobs="exact")
    seq, attn = samples.sequences, samples.attention_mask  # (B, P + R), (B, P + R)
    P, mask = samples.context_length, samples.mask  # P, (B, R)
    if samples.logprobs is not None:  # read from the sampling loop's own logits
        old_logprobs, entropy = samples.logprobs, samples.entropy  # (B, R), (B, R)
    else:  # a fresh forward: the loop's one-token products round differently (bf16, fp16, fast)
        old_logprobs, entropy = model.policy_logprobs(
            seq, attn, P, with_entropy=True, entropy_grad=False, temperature=config.temperature)
    timings["generate"] = time.perf_counter() - start

    start = time.perf_counter()
    # the reference at the policy's temperature: the KL compares the two sampling distributions
    ref_logprobs = model.ref_logprobs(seq, attn, P, temperature=config.temperature)  # (B, R)
    ref_logprobs = ref_logprobs.float()
    values = model.values(seq, attn, P).float() * mask  # (B, R), 0 at padding
    scores = score_samples(model, samples, reward_fn)  # (B,)
    timings["forward_passes"] = time.perf_counter() - start
    check_no_nan("reward scores", scores)
    if config.missing_eos_penalty is not None:
        penalised = scores + config.missing_eos_penalty  # (B,)
        scores = torch.where(samples.ended_with_eos, scores, penalised)  # (B,)

    start = time.perf_counter()
    logprobs = old_logprobs.float()  # (B, R)
    # r_t = -beta * kl_t + [t = last] * score
    rewards, kl = pieces.shape_rewards(scores, logprobs, ref_logprobs, mask, kl_coef)  # (B, R) x 2
    # delta_t = r_t + gamma V_{t+1} - V_t;  A_t = sum_l (gamma lam)^l delta_{t+l};  returns = A + V
    advantages, returns = pieces.advantages(rewards, values, mask, config.gamma,
                                            config.lam)  # (B, R) x 2
    # what the update reads, in the order it was made: the first non-finite one is named
    check_no_nan("values", values)
    check_no_nan("policy log-probs", logprobs * mask)
    check_no_nan(pieces.shaped_by, rewards)
    check_no_nan("advantages" + pieces.advantages_by, advantages)
    check_no_nan("returns" + pieces.advantages_by, returns)
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, mask)  # (B, R)
    timings["gae"] = time.perf_counter() - start
    return Experience(
        prompts=samples.prompts, responses=samples.responses, sequences=seq, attention_mask=attn,
        context_length=P, mask=mask, old_logprobs=logprobs, ref_logprobs=ref_logprobs,
        entropy=entropy.float(), values=values, scores=scores, rewards=rewards, kl=kl,
        advantages=advantages, returns=returns,
        ended_with_eos=samples.ended_with_eos, timings=timings,
    )


@torch.no_grad()
def collect_experience(
    model: SharedLoRAModel,
    tokenizer,
    prompts: Sequence[str],
    config: PPOConfig,
    kl_coef: float,
    reward_fn: RewardFn | None = None,
    step: int | None = None,
    shape_rewards_fn: ShapeRewardsFn | None = None,
    advantage_fn: AdvantageFn | None = None,
    pieces: Pieces | None = None,
) -> Experience:
    """Generate (keeping the sampling policy's log-probs), score, run the reference and value
    passes, shape rewards, and run GAE. `shape_rewards_fn` / `advantage_fn` replace the library's
    shaping (None: `shape_rewards` with config.kl_kind and config.score_clip) and GAE (`pieces`
    gives their contract); `pieces`, the trainer's resolved ones, replaces both."""
    if pieces is None:
        pieces = resolve_pieces(config.kl_kind, config.score_clip, shape_rewards_fn,
                                advantage_fn, None, None)
    with non_finite_stops_run(step):  # the maths core's NaN checks name this PPO step
        return rollout(model, tokenizer, prompts, config, kl_coef, reward_fn, pieces)


@dataclass
class Minibatch:
    """The rows of one minibatch, cut to the columns where at least one of them has a real token."""

    sequences: torch.Tensor  #: (b, p + r) prompt then response ids
    attention_mask: torch.Tensor  #: (b, p + r) 1 on real tokens
    context_length: int  #: p, prompt width after the cut
    mask: torch.Tensor  #: (b, r) 1 on real response tokens
    old_logprobs: torch.Tensor  #: (b, r) log-probs of the policy that sampled
    values: torch.Tensor  #: (b, r) old values V(s_t) of the rollout
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
    last = max(attn.shape[1] - 1 - int(real.flip(0).int().argmax()), P)  # a response column or more
    r = last + 1 - P
    return Minibatch(
        sequences=batch.sequences[rows, first : last + 1], attention_mask=attn[:, first : last + 1],
        context_length=P - first, mask=batch.mask[rows, :r],
        old_logprobs=batch.old_logprobs[rows, :r], values=batch.values[rows, :r],
        advantages=batch.advantages[rows, :r], returns=batch.returns[rows, :r])


#: the SFT texts' next-token loss of the policy on a minibatch it draws from the generator
#: (`PPOTrainer.ptx_loss`)
PtxLossFn = Callable[[torch.Generator], torch.Tensor]


def update_epochs(model: SharedLoRAModel, batch: Experience, policy_opt: AdapterOptimizer,
                  value_opt: AdapterOptimizer, config: PPOConfig, generator: torch.Generator,
                  pieces: Pieces, *, step: int, accelerator: Any = None,
                  ptx_loss: PtxLossFn | None = None) -> list[dict[str, float]]:
    """config.ppo_epochs passes over the batch in shuffled minibatches; returns one row of stats per
    minibatch. On each: the policy step (L = L_clip - c_ent * H + c_ptx * L_lm), then the value step
    (c_vf * L_V). Both losses are computed, checked and back-propagated before either adapter steps,
    so a refused loss piece leaves every weight as it was. The two adapters share no trainable
    parameter and neither loss reads the other's output, so this order changes no number.

    `step`: the PPO step (value warm-up, NaN messages); `accelerator`: the processes that vote in
    the guard and average gradients (None: one); `ptx_loss`: the c_ptx term's loss (None: no such
    term). The arguments come in the order of a caller's `update_fn` (`pieces.UpdateFn`): model,
    batch, the two optimisers, config, generator, then the maths."""
    train_policy = step >= config.value_warmup_steps  # warm-up: the critic learns the returns first
    rows: list[dict[str, float]] = []
    for epoch in range(config.ppo_epochs):
        size = batch.sequences.shape[0]  # B
        order = torch.randperm(size, generator=generator).to(batch.sequences.device)  # (B,)
        for index, first in enumerate(range(0, size, config.mini_batch_size)):
            mb = trim_minibatch(batch, order[first : first + config.mini_batch_size])
            # every process votes before the gradients' all-reduce; a refusal drops the gradients
            # of both losses
            with guard(accelerator, step, (policy_opt.optimizer, value_opt.optimizer)):
                stats = minibatch_backward(model, mb, policy_opt, value_opt, config, generator,
                                           pieces, ptx_loss=ptx_loss, train_policy=train_policy)
            policy_norm = policy_opt.sync_and_step(step) if train_policy else 0.0
            value_norm = value_opt.sync_and_step(step)
            tail = {key: stats.pop(key) for key in ("entropy_update", "ptx_loss") if key in stats}
            rows.append({"epoch": float(epoch), "minibatch": float(index), **stats,
                         "policy_grad_norm": policy_norm, "value_grad_norm": value_norm, **tail})
    return rows


def minibatch_backward(model: SharedLoRAModel, mb: Minibatch, policy_opt: AdapterOptimizer,
                       value_opt: AdapterOptimizer, config: PPOConfig, generator: torch.Generator,
                       pieces: Pieces, *, ptx_loss: PtxLossFn | None,
                       train_policy: bool) -> dict[str, float]:
    """The policy's, then the value's forward -> loss -> backward on one minibatch (no optimiser
    step); its stats. `train_policy` False (value warm-up): the policy loss is not
    back-propagated."""
    logprobs, entropy = model.policy_logprobs(  # (b, r), (b, r); no entropy backward unless used
        mb.sequences, mb.attention_mask, mb.context_length, with_entropy=True,
        entropy_grad=config.entropy_coef > 0, temperature=config.temperature)
    pg_loss, pg_stats = pieces.policy_loss(logprobs.float(), mb.old_logprobs, mb.advantages,
                                           mb.mask, config.clip_eps)
    mean_entropy = masked_mean(entropy.float(), mb.mask)
    # L = L_clip - c_ent * H (+ c_ptx * L_lm on a minibatch of SFT texts)
    loss = pg_loss - config.entropy_coef * mean_entropy
    ptx = ptx_loss(generator) if ptx_loss is not None else None
    loss = loss + config.ptx_coef * ptx if ptx is not None else loss
    check_no_nan("policy loss", loss.detach())
    if train_policy:  # a caller's loss piece is checked: its gradient must reach the adapter
        policy_opt.backward(loss, piece=pieces.policy_loss_name)
    # value: forward -> loss -> backward (it reads no policy weight: the order changes no number)
    new_values = model.values(mb.sequences, mb.attention_mask, mb.context_length).float()  # (b, r)
    v_loss, v_stats = pieces.value_loss(new_values, mb.values, mb.returns, mb.mask,
                                        config.value_clip)
    check_no_nan("value loss", v_loss.detach())
    value_opt.backward(config.vf_coef * v_loss, piece=pieces.value_loss_name)
    return {"ratio_mean": float(pg_stats["ratio_mean"]), "ratio_max": float(pg_stats["ratio_max"]),
            "policy_loss": float(pg_loss.detach()), "clipfrac": float(pg_stats["clipfrac"]),
            "approx_kl": float(pg_stats["approx_kl"]), "value_loss": float(v_loss.detach()),
            "vf_clipfrac": float(v_stats.get("vf_clipfrac", 0.0)),
            "entropy_update": float(mean_entropy.detach()),
            **({"ptx_loss": float(ptx.detach())} if ptx is not None else {})}


# the names these had before (notebooks' exercise checks hide them by these): the same functions
update = update_epochs
minibatch_losses = minibatch_backward
