"""KL towards the reference model: per-token estimators, reward shaping, and beta controllers.

All estimators estimate KL(pi || ref) = E_{y ~ pi}[log pi(y) - log ref(y)] from tokens sampled by
the policy pi, given their log-probs under pi and under the frozen reference model.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from rlhf_helpers.core.checks import (
    check_finite,
    check_floating,
    check_mask,
    check_mask_contiguous,
    check_ndim,
    check_nonempty,
    check_nonnegative,
    check_positive,
    check_same_shape,
    check_tensor,
)
from rlhf_helpers.core.kl_estimators import KL_ESTIMATORS
from rlhf_helpers.core.tokens import _last_token_index

#: names accepted by kl_estimate: the registered estimators (`core.kl_estimators`) when this module
#: was imported; `KL_ESTIMATORS` itself is the live list, `drawn_kl_kinds()` the explorers' choice
KL_KINDS = KL_ESTIMATORS.names()


def _kl_terms(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    log_rho = ref_logprobs - logprobs  # log r', r' = ref / pi
    return KL_ESTIMATORS[kind].function(log_rho)


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref): (B, T), (B, T) -> (B, T) (any same shape works).

    `kind` names one of the estimators of `core.kl_estimators` (each with its formula, bias and
    sign there). With r' = ref(y) / pi(y) for y sampled from pi (Schulman, "Approximating KL
    divergence", 2020), the first three are:
    k1 = -log r' = log pi - log ref       unbiased; negative whenever ref likes the token more
    k2 = 0.5 (log r')^2                    >= 0; biased, but close for nearby distributions
    k3 = (r' - 1) - log r'                 unbiased (E[r'] = 1) and >= 0 for every sample
    """
    KL_ESTIMATORS.check("kind", kind)
    _check_logprob_pair(logprobs, ref_logprobs)
    return _kl_terms(logprobs, ref_logprobs, kind)


def _check_logprob_pair(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> None:
    check_tensor("logprobs", logprobs)
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    check_nonempty("logprobs", logprobs)
    check_floating("logprobs", logprobs)
    check_floating("ref_logprobs", ref_logprobs)
    check_finite("logprobs", logprobs)
    check_finite("ref_logprobs", ref_logprobs)


def _check_shaping_inputs(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                          mask: torch.Tensor, kl_coef: float, kl_kind: str,
                          score_clip: float | None) -> torch.Tensor:
    """`shape_rewards`' arguments checked (ValueError naming the bad one) -> each row's last real
    token's index (B,)."""
    check_nonnegative("kl_coef", kl_coef)
    if score_clip is not None:
        check_positive("score_clip", score_clip)
    check_ndim("logprobs", logprobs, 2, "(B, T)")
    check_nonempty("logprobs", logprobs)
    check_ndim("scores", scores, 1, "(B,)")
    if scores.shape[0] != logprobs.shape[0]:
        raise ValueError(
            f"scores must have shape (B,) = ({logprobs.shape[0]},) to match logprobs, "
            f"got {tuple(scores.shape)}"
        )
    KL_ESTIMATORS.check("kl_kind", kl_kind)
    check_floating("scores", scores)
    _check_logprob_pair(logprobs, ref_logprobs)
    check_mask("mask", mask, "logprobs", logprobs)
    check_mask_contiguous("mask", mask)
    last = _last_token_index(mask)  # (B,), the mask validated above
    if bool((last < 0).any()):
        raise ValueError("mask has a row with no real token: its score has nowhere to go")
    check_finite("scores", scores)
    return last


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
    r_t  = -kl_coef * kl_t + 1[t = last real token] * score    (score clipped to +-score_clip)
    Both outputs are 0 at padding. Every row must have at least one real token (its score needs a
    place) and one contiguous block of them.
    """
    last = _check_shaping_inputs(scores, logprobs, ref_logprobs, mask,
                                 kl_coef, kl_kind, score_clip)  # (B,)
    kl = _kl_terms(logprobs, ref_logprobs, kl_kind) * mask.to(logprobs.dtype)  # (B, T)
    if score_clip is not None:
        scores = scores.clamp(-score_clip, score_clip)
    at_last = F.one_hot(last, num_classes=kl.shape[1]).to(kl.dtype)  # (B, T), 1 at last real token
    rewards = -kl_coef * kl + at_last * scores.to(kl.dtype)[:, None]  # (B, T)
    return rewards, kl


def _check_kl_value(current_kl: float | torch.Tensor) -> float:
    """A measured KL: a finite real number or one-element floating tensor (no string or bool)."""
    if isinstance(current_kl, torch.Tensor):
        if current_kl.numel() != 1 or not current_kl.is_floating_point():
            raise ValueError(f"current_kl must be a finite number or a one-element float tensor, "
                             f"got a tensor of shape {tuple(current_kl.shape)} and dtype "
                             f"{current_kl.dtype}")
        value = float(current_kl)
    elif isinstance(current_kl, numbers.Real) and not isinstance(current_kl, bool):
        value = float(current_kl)
    else:
        raise ValueError(
            f"current_kl must be a finite number, got {type(current_kl).__name__} {current_kl!r}")
    if not math.isfinite(value):
        raise ValueError(f"current_kl must be a finite number, got {value!r}")
    return value


def _check_n_steps(n_steps: int) -> int:
    """A positive integer, Python or NumPy (a dataloader's np.int64 is fine); no bool or float."""
    if not isinstance(n_steps, numbers.Integral) or isinstance(n_steps, bool) or n_steps <= 0:
        raise ValueError(f"n_steps must be a positive int, got {n_steps!r}")
    return int(n_steps)


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
    """Proportional controller steering the measured KL to a target (Ziegler et al. 2019, eq. 2).

    e = clip(KL / target - 1, -0.2, 0.2);   beta <- beta * (1 + e * min(n_steps / horizon, 1))
    KL above target raises beta (pull harder towards ref), below target lowers it.

    Ziegler et al. use K_beta = n_steps / horizon; it is capped at 1 here so that one update moves
    beta by at most 20% (the clipped error). Without the cap, n_steps > 5 * horizon and a KL below
    target give a factor 1 - 0.2 * n_steps / horizon < 0: a negative beta, which would reward
    moving away from the reference. With it beta stays > 0 (it shrinks by at most 0.8x per update).
    For n_steps <= horizon, the usual case (e.g. 64 samples, horizon 10000), nothing changes.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        check_positive("init_kl_coef", init_kl_coef)
        check_positive("target", target)
        check_positive("horizon", horizon)
        self.value = float(init_kl_coef)  #: current beta, always > 0
        self.target = float(target)  #: KL the controller aims for (nats per sequence or per token)
        self.horizon = float(horizon)  #: samples over which a full 20% correction is applied

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Move beta after `n_steps` samples (e.g. the batch size) with measured KL; return beta."""
        kl = _check_kl_value(current_kl)
        n = _check_n_steps(n_steps)
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)  # e, clipped as Ziegler's
        gain = min(n / self.horizon, 1.0)  # K_beta, capped: the factor stays in [0.8, 1.2]
        self.value *= 1.0 + proportional_error * gain
        return self.value
