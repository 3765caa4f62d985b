"""One minibatch of an experience batch: its rows, cut to the columns where one of them has a real token.

    mb = trim_minibatch(batch, rows)     # rows: (b,) indices into the experience batch
    mb.sequences, mb.old_logprobs, ...   # the same names as the Experience fields they come from

`PPOTrainer.update` draws the rows (a shuffle per epoch) and runs the policy and value steps on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhf_helpers.ppo.experience import Experience


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
    last = max(attn.shape[1] - 1 - int(real.flip(0).int().argmax()), P)  # at least one response column
    r = last + 1 - P
    return Minibatch(
        sequences=batch.sequences[rows, first : last + 1], attention_mask=attn[:, first : last + 1],
        context_length=P - first, mask=batch.mask[rows, :r], old_logprobs=batch.old_logprobs[rows, :r],
        values=batch.values[rows, :r], advantages=batch.advantages[rows, :r],
        returns=batch.returns[rows, :r])
