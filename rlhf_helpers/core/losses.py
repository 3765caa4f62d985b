"""PPO's policy and value losses, the LM (ptx) loss, and the Bradley-Terry reward-model loss.

Per-token tensors are (B, T) with a 0/1 `mask` (1 = real response token). Losses are masked
token-level means: every real token in the batch weighs the same, whatever its sequence length.
Stats are dicts of detached 0-d tensors, for logging. Float16/bfloat16 inputs are computed in
float32, and the loss and stats come back in float32 (as `lm_loss` does, and as autocast would).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf_helpers.core.checks import (
    check_finite,
    check_finite_number,
    check_floating,
    check_greater_than_one,
    check_mask,
    check_mask_nonempty,
    check_ndim,
    check_no_negative,
    check_nonempty,
    check_nonnegative,
    check_positive,
    check_same_shape,
    check_tensor,
    check_token_ids,
)

#: |log rho| is bounded by this before exp in the policy losses (verl does the same, at 20).
#: exp(20) = 4.9e8 keeps rho * A finite in float32 for any |A| < 7e29, where exp(89) is already inf
#: (and exp(12) in float16). Within the bound nothing changes, bit for bit. Beyond it the bound's
#: gradient is 0, which is what the clipped objective gives anyway on every side but one:
#: - log rho > 20, A > 0: the clipped term (1 + eps) A is selected, gradient 0 either way;
#: - log rho > 20, A < 0: the unclipped rho A is selected; its true gradient rho |A| >= 5e8 |A| (inf
#:   past 88) would swamp the whole batch after the norm clip. The bound gives 0 there, as the dual
#:   clip does for any rho above its c (c A is constant): such a token is dropped from the step;
#: - log rho < -20, A > 0: gradient rho A <= 2e-9 A with or without bound (a difference < 2e-9 A);
#: - log rho < -20, A < 0: the clipped term (1 - eps) A is selected, gradient 0 either way.
LOG_RATIO_BOUND = 20.0

_HALF = (torch.float16, torch.bfloat16)


def _work(x: torch.Tensor) -> torch.Tensor:
    """x in float32 if it is half precision (exp, squares and means overflow there), else as is."""
    return x.float() if x.dtype in _HALF else x


def _mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """sum m x / sum m for an already validated, non-empty float mask."""
    return (x * m).sum() / m.sum()


def _check_token_inputs(mask: torch.Tensor, ref_name: str, ref: torch.Tensor, **tensors) -> None:
    """Every named tensor has ref's shape and is finite; mask is 0/1 of that shape and not empty."""
    check_tensor(ref_name, ref)
    for name, x in tensors.items():
        check_same_shape(name, x, ref_name, ref)
    check_nonempty(ref_name, ref)
    check_floating(ref_name, ref)
    for name, x in tensors.items():
        check_floating(name, x)
    check_mask("mask", mask, ref_name, ref)
    check_mask_nonempty("mask", mask)
    check_finite(ref_name, ref)
    for name, x in tensors.items():
        check_finite(name, x)


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    dual_clip: float | None = None,
) -> torch.Tensor:
    """Elementwise PPO clipped objective, to MAXIMISE: ratio, advantages (same shape) -> that shape.

    obj = min(rho A, clip(rho, 1 - eps, 1 + eps) A)                    (Schulman et al. 2017, eq. 7)
    dual clip (Ye et al. 2020), only where A < 0:  obj = max(obj, c A) with c = dual_clip > 1
    The dual clip bounds how much a bad action that became much more likely can weigh.
    ratio must be finite and >= 0 (it is pi_theta / pi_old); advantages finite; both floating point.
    """
    check_positive("clip_eps", clip_eps)
    if dual_clip is not None:
        check_greater_than_one("dual_clip", dual_clip)
    check_tensor("ratio", ratio)
    check_same_shape("advantages", advantages, "ratio", ratio)
    check_nonempty("ratio", ratio)
    check_floating("ratio", ratio)
    check_floating("advantages", advantages)
    check_finite("ratio", ratio)
    check_finite("advantages", advantages)
    check_no_negative("ratio", ratio, "a probability ratio pi_theta / pi_old")
    return _clipped_surrogate(ratio, advantages, clip_eps, dual_clip)


def _clipped_surrogate(ratio, advantages, clip_eps, dual_clip) -> torch.Tensor:
    """`clipped_surrogate` for already validated inputs."""
    surr1 = ratio * advantages  # unclipped term
    surr2 = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages  # clipped term
    objective = torch.minimum(surr1, surr2)
    if dual_clip is not None:
        objective = torch.where(advantages < 0,
                                torch.maximum(objective, dual_clip * advantages), objective)
    return objective


def _bounded_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                       m: torch.Tensor) -> torch.Tensor:
    """m (log pi_theta - log pi_old), clamped to +-LOG_RATIO_BOUND: (B, T).

    Zero at padding (ratio 1 there): padded log-probs may hold anything finite, and exp of a large
    one would overflow and turn the masked mean (and its gradient, 0 * inf) into NaN.
    """
    log_ratio = (logprobs - old_logprobs) * m  # (B, T)
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clip loss: (B, T) inputs -> (scalar loss, stats).

    rho_t = exp(clamp(log pi_theta(y_t) - log pi_old(y_t), -20, 20))
    loss = -masked_mean(clipped_surrogate(rho, A, eps, dual_clip))

    The log-ratio is bounded by LOG_RATIO_BOUND = 20 before exp, so finite inputs always give a
    finite loss and gradient; for |log rho| <= 20 (any sane update) loss and gradient are unchanged
    bit for bit. Beyond it the token's gradient is 0 (see LOG_RATIO_BOUND for why that is what the
    clipped objective gives anyway, except for A < 0 without dual clip, where it drops the token).
    old_logprobs must come from the policy that SAMPLED the batch (not the reference model).
    stats: clipfrac (share of real tokens where the clipped term is selected, i.e. the gradient is
    cut), approx_kl (k3 estimate of KL(pi_old || pi_theta): mean of (rho - 1) - log rho),
    ratio_mean, ratio_max (both of the bounded rho), and dual_clipfrac when dual_clip is set.
    """
    check_positive("clip_eps", clip_eps)
    if dual_clip is not None:
        check_greater_than_one("dual_clip", dual_clip)
    _check_token_inputs(
        mask, "logprobs", logprobs, old_logprobs=old_logprobs, advantages=advantages
    )
    logprobs, old_logprobs, advantages = _work(logprobs), _work(old_logprobs), _work(advantages)
    m = mask.to(logprobs.dtype)  # (B, T)
    log_ratio = _bounded_log_ratio(logprobs, old_logprobs, m)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T), in [e^-20, e^20]
    objective = _clipped_surrogate(ratio, advantages, clip_eps, dual_clip)  # (B, T)
    loss = -_mean(objective, m)

    with torch.no_grad():
        surr1 = ratio * advantages  # (B, T)
        surr2 = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages  # (B, T)
        stats = {
            "loss": loss.detach(),
            "clipfrac": _mean((surr2 < surr1).to(m.dtype), m),
            # k3: E_old[(rho - 1) - log rho] = KL(pi_old || pi_theta), each term >= 0
            "approx_kl": _mean(torch.expm1(log_ratio) - log_ratio, m),
            "ratio_mean": _mean(ratio, m),
            "ratio_max": torch.where(m.bool(), ratio, torch.zeros_like(ratio)).max(),  # padding: 0
        }
        if dual_clip is not None:
            dual_active = (advantages < 0) & (dual_clip * advantages > torch.minimum(surr1, surr2))
            stats["dual_clipfrac"] = _mean(dual_active.to(m.dtype), m)
    return loss, stats


def kl_penalty_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's KL-penalty form (Schulman et al. 2017, eq. 8): (B, T) inputs -> (scalar loss, stats).

    loss = -masked_mean(rho_t A_t - beta * kl_t),   kl_t = (rho_t - 1) - log rho_t
    kl_t is the k3 per-token estimate of KL(pi_old || pi_theta) from tokens sampled by pi_old:
    >= 0, zero at rho = 1, and it bends the objective back smoothly as rho leaves 1.
    log rho is bounded to +-20 before exp as in `policy_loss` (no change within the bound; beyond
    it the token's gradient is 0 instead of inf/NaN).
    stats: kl (= approx_kl, the masked mean of kl_t), surrogate (masked mean of rho A), ratio_mean.
    """
    check_nonnegative("beta", beta)
    _check_token_inputs(
        mask, "logprobs", logprobs, old_logprobs=old_logprobs, advantages=advantages
    )
    logprobs, old_logprobs, advantages = _work(logprobs), _work(old_logprobs), _work(advantages)
    m = mask.to(logprobs.dtype)  # (B, T)
    log_ratio = _bounded_log_ratio(logprobs, old_logprobs, m)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T), in [e^-20, e^20]
    kl = torch.expm1(log_ratio) - log_ratio  # (B, T): (rho - 1) - log rho, accurate near rho = 1
    surrogate = ratio * advantages  # (B, T)
    loss = -_mean(surrogate - beta * kl, m)
    with torch.no_grad():
        mean_kl = _mean(kl, m)
        stats = {
            "loss": loss.detach(),
            "kl": mean_kl,
            "approx_kl": mean_kl,
            "surrogate": _mean(surrogate, m),
            "ratio_mean": _mean(ratio, m),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Critic loss WITH the 0.5 factor: (B, T) inputs -> (scalar loss, stats).

    unclipped:  loss = 0.5 * masked_mean((V - R)^2)
    clipped:    V_clip = V_old + clip(V - V_old, -c, c)
                loss = 0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2))      (c = value_clip)
    The max makes the clip pessimistic: it only removes the gradient of updates that move V more
    than c away from V_old AND would lower the error. The 0.5 makes the gradient (V - R).
    stats: vf_clipfrac (share of real tokens where the clipped error is the larger one; 0 without
    clipping), value_mse (masked mean of the unclipped (V - R)^2), values_mean.
    """
    if value_clip is not None:
        check_positive("value_clip", value_clip)
    _check_token_inputs(mask, "values", values, old_values=old_values, returns=returns)
    values, old_values, returns = _work(values), _work(old_values), _work(returns)
    m = mask.to(values.dtype)  # (B, T)
    err = (values - returns) ** 2  # (B, T)
    if value_clip is None:
        per_token = err  # (B, T)
        clipped_larger = torch.zeros_like(err, dtype=torch.bool)  # (B, T)
    else:
        values_clipped = old_values + torch.clamp(values - old_values,
                                                  -value_clip, value_clip)  # (B, T)
        err_clipped = (values_clipped - returns) ** 2  # (B, T)
        per_token = torch.maximum(err, err_clipped)  # (B, T)
        clipped_larger = err_clipped > err  # (B, T)
    loss = 0.5 * _mean(per_token, m)
    with torch.no_grad():
        stats = {
            "loss": loss.detach(),
            "vf_clipfrac": _mean(clipped_larger.to(m.dtype), m),
            "value_mse": _mean(err, m),
            "values_mean": _mean(values, m),
        }
    return loss, stats


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Shifted next-token cross-entropy (the ptx loss): logits (B, T, V), labels (B, T) -> scalar.

    loss = -mean over {t : y_{t+1} != ignore_index} of log softmax(z_t)[y_{t+1}]
    Position t predicts token t+1, so logits drop their last step and labels their first.
    labels: integer ids in [0, V) or ignore_index (int32 is fine; float and bool are refused).
    Raises ValueError if every shifted label is ignore_index (the mean would be NaN).
    """
    check_ndim("logits", logits, 3, "(B, T, V)")
    check_ndim("labels", labels, 2, "(B, T)")
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"labels must have shape (B, T) = {tuple(logits.shape[:2])} to match logits "
            f"{tuple(logits.shape)}, got {tuple(labels.shape)}"
        )
    check_nonempty("logits", logits)
    check_floating("logits", logits)
    labels = check_token_ids("labels", labels, logits.shape[-1], ignore_index)
    shift_logits = logits[:, :-1]  # (B, T-1, V): position t predicts token t+1
    shift_labels = labels[:, 1:]  # (B, T-1)
    if not bool((shift_labels != ignore_index).any()):
        raise ValueError(
            "labels has no token to predict: every label after the first is "
            f"ignore_index={ignore_index}"
        )
    check_finite("logits", logits)
    if shift_logits.dtype in (torch.float16, torch.bfloat16):
        shift_logits = shift_logits.float()  # cross-entropy in float32 for accuracy
    return F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.reshape(-1),
        ignore_index=ignore_index,
    )


def _check_pair(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> None:
    check_tensor("chosen_scores", chosen_scores)
    check_same_shape("rejected_scores", rejected_scores, "chosen_scores", chosen_scores)
    if chosen_scores.numel() == 0:
        raise ValueError("chosen_scores is empty: need at least one preference pair")
    check_floating("chosen_scores", chosen_scores)
    check_floating("rejected_scores", rejected_scores)
    check_finite("chosen_scores", chosen_scores)
    check_finite("rejected_scores", rejected_scores)


def reward_model_loss(
    chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, margin: float | torch.Tensor = 0.0
) -> torch.Tensor:
    """Bradley-Terry loss: scores of shape (B,) (or any same shape) -> scalar.

    P(chosen > rejected) = sigmoid(r_c - r_r);  loss = -mean(log sigmoid(r_c - r_r - margin))
    logsigmoid is evaluated stably (no log(0) for large negative differences). margin = 0 is plain
    Bradley-Terry; a positive margin asks for a gap of at least that size (Llama 2's variant).
    margin: a finite number, or a finite float tensor of the scores' shape (one margin per pair).
    """
    _check_pair(chosen_scores, rejected_scores)
    if isinstance(margin, torch.Tensor):
        check_same_shape("margin", margin, "chosen_scores", chosen_scores)
        check_floating("margin", margin)
        check_finite("margin", margin)
    else:
        check_finite_number("margin", margin)
    return -F.logsigmoid(chosen_scores - rejected_scores - margin).mean()


def pairwise_accuracy(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> float:
    """Share of pairs where the chosen score is higher: (B,), (B,) -> float in [0, 1].

    accuracy = mean(1[r_c > r_r] + 0.5 * 1[r_c == r_r])   (a tie counts as a coin flip, so a
    constant scorer gets 0.5, not 0)
    """
    _check_pair(chosen_scores, rejected_scores)
    ties = (chosen_scores == rejected_scores).float()  # (B,)
    wins = (chosen_scores > rejected_scores).float() + 0.5 * ties  # (B,)
    return float(wins.mean())
