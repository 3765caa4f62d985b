"""Best-of-n sampling: the no-training baseline PPO has to beat.

    result = best_of_n(shared, tokenizer, prompts, n=4)   # n SFT samples per prompt, keep the best
    result.hidden_mean, result.chosen_responses
    best_of_n_kl(4)                                       # 0.636 nats: its KL to the SFT model

For each prompt draw n responses from the reference (the SFT model: the shared base with every
adapter disabled), score them with the learned reward (the reward adapter), and keep the one with
the highest learned reward; the hidden ground-truth scorer then grades the kept response. Picking by
the learned reward and grading by the hidden one is what makes it a fair baseline for PPO, which
also only ever sees the learned reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlhf_helpers.ppo.model.samples import RewardFn, sample_responses, score_samples
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.world.scorer import hidden_scores

ScoreFn = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


def best_of_n_kl(n: int) -> float:
    """KL(best-of-n || base) = log n - (n - 1) / n nats (Stiennon et al. 2020, appendix G.3).

    Exact when the n rewards have no ties; an upper bound otherwise (Beirami et al. 2024).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    return math.log(n) - (n - 1) / n


@dataclass
class BestOfNResult:
    """n samples per prompt, their scores, and the one picked by the learned reward."""

    prompts: list[str]  #: the N prompts
    responses: list[list[str]]  #: N lists of n sampled responses
    reward_scores: torch.Tensor  #: (N, n) learned reward of every sample
    hidden_scores: torch.Tensor  #: (N, n) hidden ground-truth score of every sample
    n: int  #: samples per prompt

    def pick(self, k: int | None = None) -> torch.Tensor:
        """Index of the best of the first k samples of each prompt by the learned reward: (N,)."""
        k = self.n if k is None else k
        if not 1 <= k <= self.n:
            raise ValueError(f"k must be in [1, {self.n}], got {k}")
        return self.reward_scores[:, :k].argmax(dim=1)  # (N,)

    def hidden_mean(self, k: int | None = None) -> float:
        """Mean hidden score of the best-of-k pick (k <= n, default n): grading by the hidden
        scorer."""
        chosen = self.pick(k)  # (N,)
        return float(self.hidden_scores.gather(1, chosen[:, None]).mean())

    def reward_mean(self, k: int | None = None) -> float:
        """Mean learned reward of the best-of-k pick."""
        chosen = self.pick(k)  # (N,)
        return float(self.reward_scores.gather(1, chosen[:, None]).mean())

    @property
    def chosen_responses(self) -> list[str]:
        """The best-of-n response of each prompt."""
        return [row[i] for row, i in zip(self.responses, self.pick().tolist(), strict=True)]

    @property
    def chosen_hidden_scores(self) -> list[float]:
        """Hidden score of each chosen response."""
        return self.hidden_scores.gather(1, self.pick()[:, None])[:, 0].tolist()


def _default_hidden(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    return hidden_scores(list(prompts), list(responses))


@torch.no_grad()
def best_of_n(
    model: SharedLoRAModel,
    tokenizer,
    prompts: Sequence[str],
    n: int,
    max_new_tokens: int = PPOConfig.max_new_tokens,
    max_prompt_length: int = PPOConfig.max_prompt_length,
    temperature: float = PPOConfig.temperature,
    adapter: str | None = None,
    reward_fn: RewardFn | None = None,
    hidden_score_fn: ScoreFn = _default_hidden,
    batch_size: int = 256,
    seed: int = 0,
) -> BestOfNResult:
    """Draw n responses per prompt, score them all, keep the best by the learned reward.

    adapter=None samples the reference (SFT model); "policy" samples the PPO policy instead.
    reward_fn replaces the reward adapter when given (e.g. to pick by the hidden score itself).
    The global RNG is left untouched: sampling uses `seed`. Lengths and temperature: PPOConfig's.
    `batch_size`: samples per sampling + reward pass. Neither pass holds (rows, length, vocabulary)
    logits (sampling keeps one position's logits per step, the reward reads hidden states), so 256
    rows fit the gpu profile; `PPOTrainer.evaluate`, which does, uses config.eval_batch_size.
    """
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a non-empty list of strings")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    # sample-major order: sample j of every prompt, then sample j + 1; the n samples of a prompt are
    # i.i.d., so the first k of them are a valid best-of-k draw (`pick(k)`) from the same run
    flat_prompts = [p for _ in range(n) for p in prompts]
    rewards, texts = [], []
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for first in range(0, len(flat_prompts), batch_size):
            part = flat_prompts[first : first + batch_size]
            samples = sample_responses(model, tokenizer, part, max_prompt_length, max_new_tokens,
                                       temperature=temperature, adapter=adapter)
            rewards.append(score_samples(model, samples, reward_fn).cpu())  # (b,)
            texts.extend(samples.responses)
    hidden = torch.tensor([float(h) for h in hidden_score_fn(flat_prompts, texts)])  # (n * N,)
    N = len(prompts)
    reward_scores = torch.cat(rewards).view(n, N).T.contiguous()  # (N, n)
    hidden_scores = hidden.view(n, N).T.contiguous()  # (N, n)
    responses = [[texts[j * N + i] for j in range(n)] for i in range(N)]
    return BestOfNResult(prompts=list(prompts), responses=responses, reward_scores=reward_scores,
                         hidden_scores=hidden_scores, n=n)
