"""Reductions over real tokens only: sum, mean, variance and whitening under a 0/1 mask.

`x` and `mask` have the same shape, usually (B, T); mask is 1 on real response tokens and 0 on
padding. Padding never contributes, whatever value it holds (as long as it is finite). `x` must be
a non-empty floating-point tensor.

Float16 and bfloat16 inputs are accumulated in float32 and the result is cast back to the input
dtype: a float16 sum of 100 values of 1000 is already inf (max 65504), and whitening's eps = 1e-8
underflows to 0 in float16, which turns a constant input into 0 / 0 = NaN.
"""

from __future__ import annotations

import torch

from rlhf_helpers.core.checks import (
    check_finite,
    check_floating,
    check_mask,
    check_mask_nonempty,
    check_nonempty,
    check_positive,
    check_tensor,
)

_HALF = (torch.float16, torch.bfloat16)


def _validated(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Check x and mask; return (x in its accumulation dtype, the mask in that dtype)."""
    check_tensor("x", x)
    check_mask("mask", mask, "x", x)
    check_nonempty("x", x)
    check_floating("x", x)
    check_finite("x", x)
    work = x.float() if x.dtype in _HALF else x  # float32 accumulation for half precision
    return work, mask.to(work.dtype)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum_t m_t x_t over all elements (dim=None, a scalar) or along `dim`.

    x, mask: same shape, e.g. (B, T). Returns a 0-d tensor, or x's shape less `dim`, in x's dtype.
    """
    w, m = _validated(x, mask)
    total = (w * m).sum() if dim is None else (w * m).sum(dim=dim)
    return total.to(x.dtype)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """mean = sum_t m_t x_t / sum_t m_t, over all elements (dim=None) or along `dim`; in x's dtype.

    x, mask: same shape, e.g. (B, T). Raises ValueError if the mask (or one slice along `dim`)
    has no real token, since the mean is then undefined.
    """
    w, m = _validated(x, mask)
    check_mask_nonempty("mask", mask, dim)
    if dim is None:
        mean = (w * m).sum() / m.sum()
    else:
        mean = (w * m).sum(dim=dim) / m.sum(dim=dim)
    return mean.to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over real tokens (all elements pooled): a 0-d tensor in x's dtype.

    var = sum_t m_t (x_t - mu)^2 / (n - 1)   (unbiased; n instead of n - 1 when unbiased=False),
    with mu = masked_mean(x, mask) and n = sum_t m_t. Unbiased needs n >= 2.
    """
    w, m = _validated(x, mask)
    check_mask_nonempty("mask", mask)
    n = m.sum()
    if unbiased and n.item() < 2:
        raise ValueError("mask must have at least 2 real tokens for an unbiased variance")
    return _pooled_var(w, m, n, unbiased).to(x.dtype)


def _pooled_var(x: torch.Tensor, m: torch.Tensor, n: torch.Tensor, unbiased: bool) -> torch.Tensor:
    """sum_t m_t (x_t - mu)^2 / (n - 1 or n), for a validated float mask `m` holding n ones."""
    mean = (x * m).sum() / n
    sq_dev = ((x - mean) * m) ** 2  # (B, T): 0 at padding
    return sq_dev.sum() / (n - 1 if unbiased else n)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise x over real tokens; 0 at padding. x, mask: (B, T) -> (B, T) in x's dtype.

    white_t = m_t (x_t - mu) / sqrt(var + eps)          (shift_mean=True)
    white_t = m_t ((x_t - mu) / sqrt(var + eps) + mu)   (shift_mean=False: keeps the mean, as trl)
    with mu, var = masked_mean, masked_var (unbiased) over the whole batch.
    """
    check_positive("eps", eps)
    w, m = _validated(x, mask)
    n = m.sum()
    if n.item() < 2:
        raise ValueError("mask must have at least 2 real tokens to whiten (an unbiased variance)")
    mean = (w * m).sum() / n
    var = _pooled_var(w, m, n, unbiased=True)
    white = (w - mean) * torch.rsqrt(var + eps)  # (B, T)
    if not shift_mean:
        white = white + mean
    return (white * m).to(x.dtype)  # (B, T): padding back to 0
