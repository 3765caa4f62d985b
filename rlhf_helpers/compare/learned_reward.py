"""The learned reward adapter as a TRL reward function: the score PPO optimises, for GRPO and RLOO
too.

TRL calls `reward_fn(prompts=..., completions=..., completion_ids=..., **columns)` once per
generation batch. The function scores the prompt's ids (tokenised exactly as PPO's rollouts are)
followed by the completion's own ids, EOS included, at the last real token: the same input the
reward adapter scores in PPO, not a decoded and re-tokenised text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlhf_helpers.ppo.model.samples import tokenize_prompts
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel


class LearnedRewardFunction:
    """Scores (prompt, completion ids) with `model`'s reward adapter and score head; keeps every
    batch's scores in `rewards` (one (B,) float32 tensor per call, in the order TRL passed them)."""

    __name__ = "learned_reward"  # TRL names the reward column after the function

    def __init__(self, model: SharedLoRAModel, tokenizer: Any, max_prompt_length: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.rewards: list[torch.Tensor] = []  #: (B,) scores of each call

    @property
    def samples_scored(self) -> int:
        """Completions scored so far (the sampled responses a method trained on)."""
        return sum(len(r) for r in self.rewards)

    @torch.no_grad()
    def score(self, prompts: Sequence[str],
              completion_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Reward of each prompt + completion: (B,) float32 on the CPU."""
        if len(prompts) != len(completion_ids):
            raise ValueError(f"prompts ({len(prompts)}) and completion_ids ({len(completion_ids)}) "
                             "must have one entry per completion")
        if any(len(ids) == 0 for ids in completion_ids):
            raise ValueError(
                "completion_ids holds an empty completion: every response has at least one token")
        vocab = self.model.lm.get_input_embeddings().num_embeddings
        rows = [torch.as_tensor(list(ids)) for ids in completion_ids]  # (R_i,) each
        for row, ids in enumerate(rows):
            if ids.dtype in (torch.bool,
                             torch.uint8) or ids.is_floating_point() or ids.is_complex():
                raise ValueError(
                    f"completion_ids[{row}] must hold integer token ids, got {ids.dtype}")
            outside = ids[(ids < 0) | (ids >= vocab)]
            if len(outside):
                raise ValueError(f"completion_ids[{row}] holds the token id {int(outside[0])}, "
                                 f"outside the model's vocabulary [0, {vocab})")
        device = self.model.device
        prompt_ids, prompt_mask = tokenize_prompts(self.tokenizer, prompts, self.max_prompt_length,
                                                   device)  # (B, P)
        width = max(len(ids) for ids in completion_ids)
        shape = (len(prompts), width)
        response = torch.full(shape, self.model.pad_token_id, dtype=torch.long)  # (B, R)
        response_mask = torch.zeros(shape, dtype=torch.long)  # (B, R) 1 on real tokens
        for row, ids in enumerate(rows):
            response[row, : len(ids)] = ids.long()
            response_mask[row, : len(ids)] = 1
        input_ids = torch.cat([prompt_ids, response.to(device)], dim=1)  # (B, P + R)
        attention_mask = torch.cat([prompt_mask, response_mask.to(device)], dim=1)  # (B, P + R)
        return self.model.reward_scores(input_ids, attention_mask).float().cpu()  # (B,)

    def __call__(self, prompts: Sequence[str], completions: Sequence[Any],
                 completion_ids: Sequence[Sequence[int]], **_: Any) -> list[float]:
        scores = self.score(prompts, completion_ids)
        self.rewards.append(scores)
        return scores.tolist()
