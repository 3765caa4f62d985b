"""KL towards the reference model: per-token estimators, reward shaping, and beta controllers.

All estimators estimate KL(pi || ref) = E_{y ~ pi}[log pi(y) - log ref(y)] from tokens sampled by
the policy pi, given their log-probs under pi and under the frozen reference model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rlhf_helpers._checks import (
    check_finite,
    check_mask,
    check_mask_contiguous,
    check_ndim,
    check_nonnegative,
    check_positive,
    check_same_shape,
    check_tensor,
)

KL_KINDS = ("k1", "k2", "k3")  #: names accepted by kl_estimate


def _kl_terms(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    log_rho = ref_logprobs - logprobs  # log r', r' = ref / pi
    if kind == "k1":
        return -log_rho  # log(pi / ref)
    if kind == "k2":
        return 0.5 * log_rho**2
    return torch.expm1(log_rho) - log_rho  # (r' - 1) - log r'; expm1 is exact near r' = 1


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref): (B, T), (B, T) -> (B, T) (any same shape works).

    With r' = ref(y) / pi(y) for y sampled from pi (Schulman, "Approximating KL divergence", 2020):
    k1 = -log r' = log pi - log ref       unbiased; negative whenever ref likes the token more
    k2 = 0.5 (log r')^2                    >= 0; biased, but close for nearby distributions
    k3 = (r' - 1) - log r'                 unbiased (E[r'] = 1) and >= 0 for every sample
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kind must be one of {KL_KINDS}, got {kind!r}")
    check_tensor("logprobs", logprobs)
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    check_finite("logprobs", logprobs)
    check_finite("ref_logprobs", ref_logprobs)
    return _kl_terms(logprobs, ref_logprobs, kind)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row of a contiguous (B, T) mask: (B,), -1 for empty rows."""
    T = mask.shape[1]
    flipped_first = torch.flip(mask.to(torch.int8), dims=[1]).argmax(dim=1)  # (B,)
    last = T - 1 - flipped_first  # (B,)
    return torch.where(mask.bool().any(dim=1), last, torch.full_like(last, -1))


def shape_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    kl_kind: str = "k1",
    score_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token RLHF rewards: scores (B,), the rest (B, T) -> (rewards (B, T), kl (B, T)).

    kl_t = m_t * kl_estimate(logprobs, ref_logprobs, kl_kind)_t
    r_t  = -kl_coef * kl_t + 1[t = last real token] * score     (score clipped to +-score_clip if set)
    Both outputs are 0 at padding. Every row must have at least one real token (its score needs a
    place) and one contiguous block of them.
    """
    check_nonnegative("kl_coef", kl_coef)
    if score_clip is not None:
        check_positive("score_clip", score_clip)
    check_ndim("logprobs", logprobs, 2, "(B, T)")
    check_ndim("scores", scores, 1, "(B,)")
    if scores.shape[0] != logprobs.shape[0]:
        raise ValueError(
            f"scores must have shape (B,) = ({logprobs.shape[0]},) to match logprobs, "
            f"got {tuple(scores.shape)}"
        )
    check_mask("mask", mask, "logprobs", logprobs)
    check_mask_contiguous("mask", mask)
    last = last_token_index(mask)  # (B,)
    if bool((last < 0).any()):
        raise ValueError("mask has a row with no real token: its score has nowhere to go")
    check_finite("scores", scores)
    kl = kl_estimate(logprobs, ref_logprobs, kl_kind) * mask.to(logprobs.dtype)  # (B, T)
    if score_clip is not None:
        scores = scores.clamp(-score_clip, score_clip)
    at_last = F.one_hot(last, num_classes=kl.shape[1]).to(kl.dtype)  # (B, T): 1 at the last real token
    rewards = -kl_coef * kl + at_last * scores.to(kl.dtype)[:, None]  # (B, T)
    return rewards, kl


def _check_kl_value(current_kl: float | torch.Tensor) -> float:
    value = float(current_kl)
    if not math.isfinite(value):
        raise ValueError(f"current_kl must be a finite number, got {value!r}")
    return value


def _check_n_steps(n_steps: int) -> None:
    if not isinstance(n_steps, int) or n_steps <= 0:
        raise ValueError(f"n_steps must be a positive int, got {n_steps!r}")


class FixedKLController:
    """A constant KL coefficient beta; `update` does nothing (kept for the same interface)."""

    def __init__(self, kl_coef: float) -> None:
        check_nonnegative("kl_coef", kl_coef)
        self.value = float(kl_coef)  #: current beta

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Validate the arguments and return the unchanged beta."""
        _check_kl_value(current_kl)
        _check_n_steps(n_steps)
        return self.value


class AdaptiveKLController:
    """Proportional controller steering the measured KL towards a target (Ziegler et al. 2019).

    e = clip(KL / target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n_steps / horizon)
    KL above target raises beta (pull harder towards ref), below target lowers it.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        check_positive("init_kl_coef", init_kl_coef)
        check_positive("target", target)
        check_positive("horizon", horizon)
        self.value = float(init_kl_coef)  #: current beta
        self.target = float(target)  #: KL the controller aims for (nats per sequence or per token)
        self.horizon = horizon  #: steps over which a full 20% correction is applied

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Move beta after `n_steps` samples (e.g. the batch size) with measured KL; return beta."""
        kl = _check_kl_value(current_kl)
        _check_n_steps(n_steps)
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
        return self.value
