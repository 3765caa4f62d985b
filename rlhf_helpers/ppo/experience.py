"""Rollouts: sample responses (`samples`), score them, run the reference and value passes, shape rewards, GAE.

    batch = collect_experience(shared, tokenizer, prompts, config, kl_coef=0.05)

Everything here runs without gradients; `batch` holds what the update epochs need (old log-probs of
the policy that sampled, old values, advantages, returns) and what the metrics report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rlhf_helpers.core.checks import check_no_nan
from rlhf_helpers.core.masked import masked_mean, masked_whiten
from rlhf_helpers.ppo.guards import non_finite_stops_run
from rlhf_helpers.ppo.pieces import AdvantageFn, Pieces, ShapeRewardsFn, resolve_pieces
from rlhf_helpers.ppo.samples import RewardFn, sample_responses, score_samples
from rlhf_helpers.ppo.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.ppo_config import PPOConfig


@dataclass
class Experience:
    """One batch of rollouts: B prompts of padded width P, responses of width R."""

    prompts: list[str]  #: the prompt texts
    responses: list[str]  #: decoded responses (EOS and padding removed, leading space)
    sequences: torch.Tensor  #: (B, P + R) left-padded prompt ids then response ids (pad after EOS)
    attention_mask: torch.Tensor  #: (B, P + R) 1 on real prompt and response tokens (EOS included)
    context_length: int  #: P, padded prompt width
    mask: torch.Tensor  #: (B, R) 1 on real response tokens up to and including EOS
    #: (B, R) log-probs under the distribution that sampled: the policy at config.temperature
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor  #: (B, R) log-probs under the reference (adapters disabled), same temperature
    entropy: torch.Tensor  #: (B, R) entropy of the sampling distribution at each response position
    values: torch.Tensor  #: (B, R) old values V(s_t) of the value adapter + head
    scores: torch.Tensor  #: (B,) reward-model score (or reward_fn) of each response
    rewards: torch.Tensor  #: (B, R) shaped rewards: -beta * kl_t, plus the score at the last token
    kl: torch.Tensor  #: (B, R) per-token KL estimate (masked)
    advantages: torch.Tensor  #: (B, R) GAE advantages (whitened if the config says so)
    returns: torch.Tensor  #: (B, R) GAE returns = raw advantages + values
    ended_with_eos: torch.Tensor  #: (B,) True where the response stopped at EOS
    timings: dict[str, float] = field(default_factory=dict)  #: seconds per phase

    def __len__(self) -> int:
        return self.sequences.shape[0]


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[returns - values] / Var[returns] over real tokens (1: perfect critic, <= 0: useless)."""
    m = mask.bool()
    target = returns[m]
    if target.numel() < 2:
        return float("nan")
    var = target.var()
    return float(1.0 - (target - values[m]).var() / var) if var > 0 else float("nan")


def eos_kept_share(batch: Experience, eos_token_id: int) -> float:
    """The share of the batch's sampled EOS tokens (each response's first) that its loss mask keeps: 1 when the
    mask is built from the first EOS; below 1 when a "not padding" mask with pad == EOS hides them (the
    update then never trains the decision to stop). 1.0 when no response stopped at an EOS."""
    responses = batch.sequences[:, batch.context_length:]  # (B, R)
    ended = batch.ended_with_eos  # (B,)
    if not bool(ended.any()):
        return 1.0
    first_eos = (responses == eos_token_id).int().argmax(dim=1, keepdim=True)  # (B, 1): the first EOS's column
    kept = batch.mask.gather(1, first_eos).squeeze(1)  # (B,)
    # counts, divided once in Python: a float32 mean on CUDA (sum x 1/n) gave 0.99999994 for all kept
    return int((kept[ended] != 0).sum()) / int(ended.sum())


def rollout_metrics(batch: Experience, kl_coef: float,
                    hidden_score_fn: Callable[[Sequence[str], Sequence[str]], Sequence[float]] | None = None,
                    score_clip: float | None = None) -> dict[str, float]:
    """The rollout half of an iteration's metrics (docs/metrics.md): reward and its spread, k1 sequence
    KL, entropy, lengths, distinct responses, critic fit; with `hidden_score_fn`, the mean ground-truth
    score of the batch; with `score_clip`, the share of scores the clip cuts."""
    mask = batch.mask
    seq_kl = ((batch.old_logprobs - batch.ref_logprobs) * mask).sum(dim=1)  # (B,) k1 sequence KL
    scores = batch.scores.float()  # (B,)
    metrics = {
        "score": float(scores.mean()),
        "score_std": float(scores.std(unbiased=False)),
        "distinct_responses": len(set(batch.responses)) / len(batch.responses),
        "kl": float(seq_kl.mean()),
        "kl_coef": float(kl_coef),
        "entropy": float(masked_mean(batch.entropy, mask)),
        "response_length": float(mask.sum(dim=1).mean()),
        "eos_fraction": float(batch.ended_with_eos.float().mean()),
        "explained_variance": explained_variance(batch.values, batch.returns, mask),
        "return_mean": float(masked_mean(batch.returns, mask)),
        "value_mean": float(masked_mean(batch.values, mask)),
    }
    if score_clip is not None:
        metrics["score_clipped"] = float((scores.abs() >= score_clip).float().mean())
    if hidden_score_fn is not None:
        hidden = hidden_score_fn(batch.prompts, batch.responses)
        metrics["hidden_score"] = sum(hidden) / len(hidden)
    return metrics


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
    """Generate (keeping the sampling policy's log-probs), score, run the reference and value passes,
    shape rewards, and run GAE. `shape_rewards_fn` / `advantage_fn` replace the library's shaping (None:
    `shape_rewards` with config.kl_kind and config.score_clip) and GAE (`pieces` gives their contract);
    `pieces`, the trainer's resolved ones, replaces both."""
    if pieces is None:
        pieces = resolve_pieces(config.kl_kind, config.score_clip, shape_rewards_fn, advantage_fn, None, None)
    with non_finite_stops_run(step):  # the maths core's NaN checks name this PPO step
        return rollout(model, tokenizer, prompts, config, kl_coef, reward_fn, pieces)


@torch.no_grad()
def rollout(model: SharedLoRAModel, tokenizer, prompts: Sequence[str], config: PPOConfig, kl_coef: float,
            reward_fn: RewardFn | None, pieces: Pieces) -> Experience:
    """The experience half of one iteration, in the order it runs (no gradients). A NaN/inf stops it with
    NonFiniteError naming the first tensor that holds one (the caller's guard adds the PPO step)."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    # old log-probs: the distribution that sampled, softmax(z / T) of the policy (never the reference)
    samples = sample_responses(model, tokenizer, prompts, config.max_prompt_length, config.max_new_tokens,
                               temperature=config.temperature, with_logprobs="exact")
    seq, attn, P, mask = samples.sequences, samples.attention_mask, samples.context_length, samples.mask
    if samples.logprobs is not None:  # read from the sampling loop's own logits
        old_logprobs, entropy = samples.logprobs, samples.entropy  # (B, R), (B, R)
    else:  # a fresh forward: the loop's one-token products round differently (bf16/fp16, fast decoder)
        old_logprobs, entropy = model.policy_logprobs(
            seq, attn, P, with_entropy=True, entropy_grad=False, temperature=config.temperature)
    timings["generate"] = time.perf_counter() - start

    start = time.perf_counter()
    # the reference at the policy's temperature: the KL compares the two sampling distributions
    ref_logprobs = model.ref_logprobs(seq, attn, P, temperature=config.temperature).float()  # (B, R)
    values = model.values(seq, attn, P).float() * mask  # (B, R), 0 at padding
    scores = score_samples(model, samples, reward_fn)  # (B,)
    timings["forward_passes"] = time.perf_counter() - start
    check_no_nan("reward scores", scores)
    if config.missing_eos_penalty is not None:
        scores = torch.where(samples.ended_with_eos, scores, scores + config.missing_eos_penalty)  # (B,)

    start = time.perf_counter()
    logprobs = old_logprobs.float()  # (B, R)
    # r_t = -beta * kl_t + [t = last] * score
    rewards, kl = pieces.shape_rewards(scores, logprobs, ref_logprobs, mask, kl_coef)  # (B, R) x 2
    # delta_t = r_t + gamma V_{t+1} - V_t;  A_t = sum_l (gamma lam)^l delta_{t+l};  returns = A + V
    advantages, returns = pieces.advantages(rewards, values, mask, config.gamma, config.lam)  # (B, R) x 2
    # what the update reads, in the order it was made: the first non-finite one is named, with its piece
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
        advantages=advantages, returns=returns, ended_with_eos=samples.ended_with_eos, timings=timings,
    )
