"""Prompt texts in, a batch of sampled responses out: tokenize, sample, mask, decode, score.

    samples = sample_responses(shared, tokenizer, prompts, max_prompt_length=16, max_new_tokens=40)
    scores = score_samples(shared, samples)       # (B,) the reward adapter's, or reward_fn's

`iteration.rollout` (and `iteration.collect_experience`) builds a rollout on these; evaluation,
best-of-n and the notebooks sample with them too. `Samples` keeps the names the later batches use
(`Experience`, `Minibatch`): sequences, attention_mask, context_length, mask; its `logprobs` become
the experience's `old_logprobs` (old from the update's point of view: the policy that sampled,
before this iteration's steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from rlhf_helpers.core.tokens import mask_to_first_eos
from rlhf_helpers.ppo.model.sampling import sample_model
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel

#: reward_fn(prompts, responses) -> one score per pair (replaces the reward adapter when given)
RewardFn = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


def tokenize_prompts(tokenizer, prompts: Sequence[str], max_prompt_length: int,
                     device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask (B, P); a prompt over max_prompt_length loses its start."""
    if not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    side = tokenizer.truncation_side
    tokenizer.truncation_side = "left"  # keep a long prompt's end: what the response follows
    try:
        enc = tokenizer(list(prompts), return_tensors="pt", padding=True, truncation=True,
                        max_length=max_prompt_length, padding_side="left")
    finally:
        tokenizer.truncation_side = side
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)  # (B, P), (B, P)


def decode_responses(tokenizer, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Response texts without EOS and padding, each starting with a space (as the data files do)."""
    texts = []
    for row, row_mask in zip(responses.tolist(), mask.tolist(), strict=True):
        ids = [t for t, m in zip(row, row_mask, strict=True) if m > 0]
        texts.append(" " + tokenizer.decode(ids, skip_special_tokens=True).strip())
    return texts


@dataclass
class Samples:
    """Sampled responses to B prompts, before any scoring."""

    prompts: list[str]  #: the prompt texts
    responses: list[str]  #: decoded responses (EOS and padding removed, leading space)
    sequences: torch.Tensor  #: (B, P + R) left-padded prompt ids then response ids (pad after EOS)
    attention_mask: torch.Tensor  #: (B, P + R) 1 on real prompt and response tokens (EOS included)
    context_length: int  #: P, padded prompt width
    mask: torch.Tensor  #: (B, R) 1 on response tokens up to and including EOS
    ended_with_eos: torch.Tensor  #: (B,) True where the response stopped at EOS
    #: (B, R) log-probs of the sampled tokens under the sampling model (only with `with_logprobs`)
    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  #: (B, R) the sampling model's entropy there (same case)


@torch.no_grad()
def sample_responses(model: SharedLoRAModel, tokenizer, prompts: Sequence[str],
                     max_prompt_length: int, max_new_tokens: int, temperature: float = 1.0,
                     adapter: str | None = "policy",
                     with_logprobs: bool | Literal["exact"] = False) -> Samples:
    """Sample one response per prompt (KV cache; no top-k/top-p; stop at EOS). `adapter=None`: the
    reference (the SFT model). Uses the global torch RNG. `with_logprobs`: also keep each sampled
    token's log-prob and entropy, read from the sampling loop's own logits
    (`sampling.sample_model`); "exact": only where they equal a training forward's
    (`sampling_logprobs_are_exact`), else None."""
    if with_logprobs == "exact":
        with_logprobs = sampling_logprobs_are_exact(model)
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, max_prompt_length,
                                               model.device)  # (B, P)
    P = prompt_ids.shape[1]
    sequences, logprobs, entropy = sample_model(  # (B, P + R), (B, R) x2
        model, prompt_ids, prompt_mask, max_new_tokens, temperature=temperature, adapter=adapter,
        with_logprobs=with_logprobs)
    responses = sequences[:, P:]  # (B, R)
    mask = mask_to_first_eos(responses, model.eos_token_id)  # (B, R)
    attention_mask = torch.cat([prompt_mask.to(mask.dtype), mask], dim=1).long()  # (B, P + R)
    ended_with_eos = ((responses == model.eos_token_id) & mask.bool()).any(dim=1)  # (B,)
    return Samples(prompts=list(prompts), responses=decode_responses(tokenizer, responses, mask),
                   sequences=sequences, attention_mask=attention_mask, context_length=P, mask=mask,
                   ended_with_eos=ended_with_eos, logprobs=logprobs, entropy=entropy)


@torch.no_grad()
def score_samples(model: SharedLoRAModel, samples: Samples,
                  reward_fn: RewardFn | None = None) -> torch.Tensor:
    """Reward of each sample: the reward adapter + score head at the last real token (EOS), or
    `reward_fn(prompts, responses)` when given: (B,) float32."""
    if reward_fn is None:
        return model.reward_scores(samples.sequences, samples.attention_mask).float()  # (B,)
    raw = list(reward_fn(list(samples.prompts), list(samples.responses)))
    if len(raw) != len(samples.prompts):
        raise ValueError(f"reward_fn must return {len(samples.prompts)} scores (one per prompt), "
                         f"got {len(raw)}")
    return torch.tensor([float(s) for s in raw], dtype=torch.float32,
                        device=samples.sequences.device)  # (B,)


def sampling_logprobs_are_exact(model: SharedLoRAModel) -> bool:
    """True when the sampling loop's log-probs equal a training forward's up to float32 rounding:
    a float32 model sampled with the plain decoder (peft's own LoRA forward, a token at a time)."""
    return model.compute_dtype == torch.float32 and not model.fast_sampling
