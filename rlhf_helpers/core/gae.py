"""TD errors and generalised advantage estimation (Schulman et al. 2016) over padded batches.

Conventions for every function here (rewards, values, mask: (B, T)):
- mask is 1 on real response tokens, 0 on padding, and each row is ONE contiguous block of ones
  (right padding 1 1 1 0 0, or prompt positions first 0 0 1 1 0). A row with holes (1 0 1) raises
  ValueError: it has no single "end of the response", so what the value after a hole should be is
  ambiguous. An all-zero row is allowed and gives zeros.
- The response ends at its last real token: the value after it counts as 0 (the episode is over).
- Outputs are 0 at padding; values at padding are ignored (they may hold anything finite).
- rewards and values must be floating point (an integer tensor raises ValueError), and T >= 1:
  a zero-length batch raises ValueError, as everywhere in the maths core.
"""

from __future__ import annotations

import functools

import torch

from rlhf_helpers.core.advantage_estimators import advantage_estimator
from rlhf_helpers.core.checks import (
    check_finite,
    check_floating,
    check_mask,
    check_mask_contiguous,
    check_ndim,
    check_nonempty,
    check_same_shape,
    check_unit_interval,
)

#: Time steps handled by one discount-matrix product; longer sequences are processed chunk by chunk
#: (a short loop over chunks, not tokens) so memory stays O(T * chunk) instead of O(T^2).
GAE_CHUNK = 512


def _check_gae_inputs(rewards, values, mask, gamma, lam=None) -> None:
    check_ndim("rewards", rewards, 2, "(B, T)")
    check_same_shape("values", values, "rewards", rewards)
    check_nonempty("rewards", rewards)
    check_floating("rewards", rewards)
    check_floating("values", values)
    check_mask("mask", mask, "rewards", rewards)
    check_mask_contiguous("mask", mask)
    check_unit_interval("gamma", gamma)
    if lam is not None:
        check_unit_interval("lam", lam)
    check_finite("rewards", rewards)
    check_finite("values", values)


def _td_errors(rewards, values, m, gamma) -> torch.Tensor:
    """delta_t = m_t (r_t + gamma m_{t+1} V_{t+1} - V_t), for an already validated float mask m."""
    next_values = torch.zeros_like(values)  # (B, T): V(s_{t+1}), 0 past the last real token
    next_values[:, :-1] = values[:, 1:] * m[:, 1:]
    return (rewards + gamma * next_values - values) * m  # (B, T)


def td_errors(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """One-step TD errors: (B, T) inputs -> (B, T), 0 at padding.

    delta_t = r_t + gamma * V_{t+1} - V_t, with V_{t+1} = 0 after the last real token.
    """
    _check_gae_inputs(rewards, values, mask, gamma)
    return _td_errors(rewards, values, mask.to(rewards.dtype), gamma)


@functools.lru_cache(maxsize=32)  # PPO calls GAE with the same (T, gamma * lam) every batch
def _discount_matrix(size: int, decay: float, dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor:
    """D[t, u] = decay^(u - t) for u >= t, else 0: (size, size), upper triangular, read-only.

    Built from powers, never from ratios such as decay^u / decay^t, which overflow for long T and
    small decay: here small powers simply underflow to 0, which is their correct limit.
    """
    # built in float64 on the CPU (some accelerators, e.g. Apple MPS, have no float64), then moved
    steps = torch.arange(size, dtype=torch.float64)
    offsets = steps[None, :] - steps[:, None]  # (size, size): u - t
    powers = torch.pow(torch.tensor(decay, dtype=torch.float64), offsets.clamp(min=0))
    # (size, size); 0^0 = 1 keeps the diagonal for decay = 0
    return torch.triu(powers).to(device=device, dtype=dtype)


@advantage_estimator("gae")
def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised GAE: (B, T) inputs -> (advantages (B, T), returns (B, T)), both 0 at padding.

    A_t = sum_{u >= t} (gamma lam)^(u - t) delta_u      (= delta_t + gamma lam A_{t+1})
    returns_t = A_t + V_t                               (the lambda-return, the critic's target)

    Computed as delta @ D^T with the discount matrix D[t, u] = (gamma lam)^(u - t) (u >= t), in
    chunks of GAE_CHUNK steps: within a chunk one matrix product; across chunks the advantage at the
    start of the next chunk is carried back with weight (gamma lam)^(distance). No loop over tokens.
    Float16/bfloat16 inputs are computed in float32 and cast back.
    """
    _check_gae_inputs(rewards, values, mask, gamma, lam)
    out_dtype = rewards.dtype
    work_dtype = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    r, v = rewards.to(work_dtype), values.to(work_dtype)  # (B, T)
    m = mask.to(work_dtype)  # (B, T)
    deltas = _td_errors(r, v, m, gamma)  # (B, T), 0 at padding so sums stop at the response end
    decay = gamma * lam
    T = deltas.shape[1]  # >= 1 (checked)
    chunk = min(T, GAE_CHUNK)
    discount = _discount_matrix(chunk, decay, work_dtype, deltas.device)  # (C, C)
    advantages = torch.empty_like(deltas)  # (B, T)
    carry = torch.zeros_like(deltas[:, 0])  # (B,): A at the first step after the current chunk
    for end in range(T, 0, -chunk):  # T / GAE_CHUNK iterations: one for T <= GAE_CHUNK
        start = max(0, end - chunk)
        size = end - start
        d = discount[chunk - size :, chunk - size :]  # (size, size), same structure
        # carry weight for step t: decay^(end - t) for t in [start, end)
        tail = d[:, -1] * decay  # (size,)
        block = deltas[:, start:end] @ d.T + carry[:, None] * tail[None, :]  # (B, size)
        advantages[:, start:end] = block
        carry = block[:, 0]
    advantages = advantages * m  # (B, T)
    returns = (advantages + v) * m  # (B, T)
    return advantages.to(out_dtype), returns.to(out_dtype)


def gae_reference(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE by the plain reverse loop of trlx / cleanrl, one sample at a time (slow; for tests).

    For each row, take its real tokens t = 0 .. L-1 and run
        next_value = V_{t+1} if t < L - 1 else 0
        delta = r_t + gamma * next_value - V_t
        lastgaelam = delta + gamma * lam * lastgaelam
        A_t = lastgaelam
    then returns_t = A_t + V_t. Same inputs, outputs and conventions as `compute_gae`.
    """
    _check_gae_inputs(rewards, values, mask, gamma, lam)
    advantages = torch.zeros_like(rewards)  # (B, T)
    returns = torch.zeros_like(rewards)  # (B, T)
    for b in range(rewards.shape[0]):
        real = mask[b].nonzero().flatten().tolist()  # indices of real tokens, contiguous
        length = len(real)
        lastgaelam = 0.0
        for i in reversed(range(length)):
            t = real[i]
            next_value = values[b, t + 1] if i < length - 1 else 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            lastgaelam = delta + gamma * lam * lastgaelam
            advantages[b, t] = lastgaelam
            returns[b, t] = lastgaelam + values[b, t]
    return advantages, returns
