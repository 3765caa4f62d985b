"""The experience batch of one iteration (`Experience`) and the rollout's metrics.

    batch = collect_experience(shared, tokenizer, prompts, config, kl_coef=0.05)   # `iteration`
    metrics = rollout_metrics(batch, kl_coef=0.05)

`batch` holds what the update epochs need (old log-probs of the policy that sampled, old values,
advantages, returns) and what the metrics report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rlhf_helpers.core.masked import masked_mean

#: (prompts, responses) -> the ground-truth score of each response
HiddenScoreFn = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


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
    ref_logprobs: torch.Tensor  #: (B, R) the reference's log-probs (adapters off), same temperature
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
    """1 - Var[returns - values] / Var[returns], real tokens (1: perfect critic, <= 0: useless)."""
    m = mask.bool()
    target = returns[m]
    if target.numel() < 2:
        return float("nan")
    var = target.var()
    return float(1.0 - (target - values[m]).var() / var) if var > 0 else float("nan")


def eos_kept_share(batch: Experience, eos_token_id: int) -> float:
    """The share of the batch's sampled EOS tokens (each response's first) that its loss mask keeps:
    1 when the mask is built from the first EOS; below 1 when a "not padding" mask with pad == EOS
    hides them (the update then never trains the decision to stop). 1.0 when no response stopped at
    an EOS."""
    responses = batch.sequences[:, batch.context_length:]  # (B, R)
    ended = batch.ended_with_eos  # (B,)
    if not bool(ended.any()):
        return 1.0
    first_eos = (responses == eos_token_id).int().argmax(dim=1, keepdim=True)  # (B, 1) its column
    kept = batch.mask.gather(1, first_eos).squeeze(1)  # (B,)
    # counts, divided once in Python: a float32 mean on CUDA (sum x 1/n) gave 0.99999994, all kept
    return int((kept[ended] != 0).sum()) / int(ended.sum())


def rollout_metrics(batch: Experience, kl_coef: float,
                    hidden_score_fn: HiddenScoreFn | None = None,
                    score_clip: float | None = None) -> dict[str, float]:
    """The rollout half of an iteration's metrics (docs/metrics.md): reward and its spread, k1
    sequence KL, entropy, lengths, distinct responses, critic fit; with `hidden_score_fn`, the mean
    ground-truth score of the batch; with `score_clip`, the share of scores the clip cuts."""
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
