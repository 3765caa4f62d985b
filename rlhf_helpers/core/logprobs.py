"""Per-token log-probabilities and entropies from a language model's logits."""

from __future__ import annotations

import torch

from rlhf_helpers.core.checks import (
    check_finite,
    check_floating,
    check_ndim,
    check_nonempty,
    check_token_ids,
)

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    # log-softmax in half precision loses several digits of every log-prob; float32 is cheap enough.
    return logits.float() if logits.dtype in _LOW_PRECISION else logits


def _check_logits(logits: torch.Tensor) -> None:
    """(B, T, V) float logits with B, T, V >= 1 (V = 0 would make every log-prob -inf)."""
    check_nonempty("logits", logits)
    check_floating("logits", logits)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log pi(y_t | .) for the given tokens: logits (B, T, V), labels (B, T) -> (B, T).

    log pi(y_t) = z_{t, y_t} - logsumexp_v z_{t, v}    (z = logits; no (B, T, V) log-softmax copy)

    No shift: logits[:, t] must already be the distribution over labels[:, t]. For a causal LM that
    means passing logits[:, :-1] and input_ids[:, 1:]. Half-precision logits are computed in fp32.
    """
    check_ndim("logits", logits, 3, "(B, T, V)")
    check_ndim("labels", labels, 2, "(B, T)")
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must have shape (B, T) = {tuple(logits.shape[:2])} to match logits "
            f"{tuple(logits.shape)}, got {tuple(labels.shape)}"
        )
    _check_logits(logits)
    labels = check_token_ids("labels", labels, logits.shape[-1])  # (B, T) int64 (no float/bool)
    check_finite("logits", logits)
    z = _upcast(logits)  # (B, T, V)
    picked = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(z, dim=-1)  # (B, T)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution at every position: logits (B, T, V) -> (B, T).

    H_t = -sum_v p_v log p_v = logsumexp_v z_v - sum_v p_v z_v     (p = softmax(z); stable form)
    """
    check_ndim("logits", logits, 3, "(B, T, V)")
    _check_logits(logits)
    check_finite("logits", logits)
    z = _upcast(logits)  # (B, T, V)
    probs = torch.softmax(z, dim=-1)  # (B, T, V)
    return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)  # (B, T)
