"""Judge a policy on held-out prompts: learned reward, hidden score and KL to the reference.

    row = evaluate_policy(model, tokenizer, prompts, max_prompt_length=16, max_new_tokens=40)
    row["eval_hidden_score"], row["eval_score"], row["eval_kl"]

One fresh sample per prompt from the policy adapter, with a fixed seed (the caller's RNG untouched),
so two policies judged with the same seed differ only by the policy. PPOTrainer.evaluate and the
method comparison of notebook 07 (`rlhf_helpers.compare`) both call this function, so every method
is judged by the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlhf_helpers.ppo.model.samples import RewardFn, sample_responses, score_samples
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel

#: hidden_score_fn(prompts, responses) -> ground-truth scores (e.g. world.scorer.hidden_scores)
ScoreFn = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


@torch.no_grad()
def evaluate_policy(model: SharedLoRAModel, tokenizer, prompts: Sequence[str], *,
                    max_prompt_length: int, max_new_tokens: int, temperature: float = 1.0,
                    batch_size: int = 64, seed: int = 12345, reward_fn: RewardFn | None = None,
                    hidden_score_fn: ScoreFn | None = None) -> dict[str, float]:
    """Mean reward score, hidden score and sequence KL of one fresh sample per prompt.

    The prompts go through in batches of `batch_size`: each log-prob pass holds (batch, response
    length, vocabulary) float logits, ~5 GB for 200 prompts of the gpu profile at once.

    eval_kl = mean over prompts of sum_t (log pi_T(y_t) - log ref_T(y_t)), the k1 sequence KL of the
    policy's own samples (an unbiased estimate of KL(pi_T || ref_T) per response, both at
    `temperature`, like the training kl). `reward_fn=None` scores with the reward adapter;
    `hidden_score_fn=None` leaves out eval_hidden_score.
    """
    if not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    scores, seq_kls, lengths, responses = [], [], [], []
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for first in range(0, len(prompts), batch_size):
            part = list(prompts[first : first + batch_size])
            samples = sample_responses(model, tokenizer, part, max_prompt_length, max_new_tokens,
                                       temperature=temperature)
            seq, attn, P, mask = (samples.sequences, samples.attention_mask,
                                  samples.context_length, samples.mask)
            logp = model.policy_logprobs(seq, attn, P, temperature=temperature).float()  # (b, R)
            ref = model.ref_logprobs(seq, attn, P, temperature=temperature).float()  # (b, R)
            seq_kls.append(((logp - ref) * mask).sum(dim=1))  # (b,)
            scores.append(score_samples(model, samples, reward_fn))  # (b,)
            lengths.append(mask.sum(dim=1))  # (b,)
            responses.extend(samples.responses)
    out = {"eval_score": float(torch.cat(scores).mean()),
           "eval_kl": float(torch.cat(seq_kls).mean()),
           "eval_response_length": float(torch.cat(lengths).mean())}
    if hidden_score_fn is not None:
        hidden = hidden_score_fn(list(prompts), responses)
        out["eval_hidden_score"] = sum(hidden) / len(hidden)
    return out
