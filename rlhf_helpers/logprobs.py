"""Per-token log-probabilities and entropies from a language model's logits."""

from __future__ import annotations

import torch

from rlhf_helpers._checks import check_finite, check_ndim

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    # log-softmax in half precision loses several digits of every log-prob; float32 is cheap enough.
    return logits.float() if logits.dtype in _LOW_PRECISION else logits


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log pi(y_t | .) for the given tokens: logits (B, T, V), labels (B, T) -> (B, T).

    log pi(y_t) = z_{t, y_t} - logsumexp_v z_{t, v}     (z = logits; no log-softmax copy of (B, T, V))

    No shift: logits[:, t] must already be the distribution over labels[:, t]. For a causal LM that
    means passing logits[:, :-1] and input_ids[:, 1:]. Half-precision logits are computed in float32.
    """
    check_ndim("logits", logits, 3, "(B, T, V)")
    check_ndim("labels", labels, 2, "(B, T)")
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must have shape (B, T) = {tuple(logits.shape[:2])} to match logits "
            f"{tuple(logits.shape)}, got {tuple(labels.shape)}"
        )
    if labels.is_floating_point():
        raise ValueError(f"labels must be integer token ids, got dtype {labels.dtype}")
    vocab = logits.shape[-1]
    if labels.numel() and bool(((labels < 0) | (labels >= vocab)).any()):
        raise ValueError(f"labels must be token ids in [0, {vocab}), got values outside that range")
    check_finite("logits", logits)
    z = _upcast(logits)  # (B, T, V)
    picked = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(z, dim=-1)  # (B, T)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution at every position: logits (B, T, V) -> (B, T).

    H_t = -sum_v p_v log p_v = logsumexp_v z_v - sum_v p_v z_v     (p = softmax(z); stable form)
    """
    check_ndim("logits", logits, 3, "(B, T, V)")
    check_finite("logits", logits)
    z = _upcast(logits)  # (B, T, V)
    probs = torch.softmax(z, dim=-1)  # (B, T, V)
    return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)  # (B, T)
