"""Input validation shared by the maths core: each check raises ValueError naming the argument.

Rules every function of the maths core follows (gae, kl, losses, masked, logprobs):
- empty inputs (B = 0 or T = 0, a zero-length sequence) raise ValueError: there is no token to
  estimate anything from, and an empty result would only move the failure downstream;
- real-valued tensors (rewards, values, log-probs, scores, logits...) must be floating point: an
  integer tensor raises ValueError instead of being truncated or promoted silently;
- token ids (labels) must be integer tensors (not bool) holding ids in [0, V).

Checks are cheap (a shape comparison, or one reduction over a tensor the caller already holds), but
the value checks (finite, 0/1 mask, non-empty mask) each read one boolean back from the device,
which on a GPU is a synchronisation. Wrap a hot loop in ``validation(False)`` to skip the value
checks once the pipeline is known to be sound; shape checks always run because they cost nothing.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator

import torch

_VALUE_CHECKS = True  # module switch read by the value checks below


class NonFiniteError(ValueError):
    """A NaN or an inf where the maths needs finite numbers (logits, rewards, values, losses).

    A ValueError, so callers that catch bad input still catch it; code that must tell it apart (the
    PPO run's stop, the sampler's fallback) catches this type, never the message text.
    """


@contextlib.contextmanager
def validation(enabled: bool) -> Iterator[None]:
    """Turn the value checks (NaN/inf, 0/1 masks, empty masks, mask layout) on or off in a block."""
    global _VALUE_CHECKS
    previous = _VALUE_CHECKS
    _VALUE_CHECKS = bool(enabled)
    try:
        yield
    finally:
        _VALUE_CHECKS = previous


def _is_number(value: object) -> bool:
    """A real number: int, float or NumPy scalar (not a bool, not a string, not a tensor)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_tensor(name: str, x: object) -> None:
    """`x` must be a torch.Tensor."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_ndim(name: str, x: torch.Tensor, ndim: int, shape_doc: str) -> None:
    """`x` must be a tensor with `ndim` dimensions; `shape_doc` (e.g. "(B, T)") is for errors."""
    check_tensor(name, x)
    if x.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {tuple(x.shape)}")


def check_nonempty(name: str, x: torch.Tensor) -> None:
    """`x` must hold an element: no zero-length sequence (T = 0), no empty batch (B = 0)."""
    if x.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(x.shape)}): "
            "need at least one sequence and one time step"
        )


def check_floating(name: str, x: torch.Tensor) -> None:
    """`x` must be a floating-point tensor (integer rewards, values or log-probs are refused, not
    truncated or promoted behind the caller's back)."""
    if not x.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor, got dtype {x.dtype} "
            "(convert it with .float())"
        )


def check_token_ids(name: str, ids: torch.Tensor, vocab: int,
                    ignore_index: int | None = None) -> torch.Tensor:
    """`ids` must be integer token ids in [0, vocab) (or `ignore_index`); returns them as int64.

    Any integer dtype works (int32 ids are widened, which changes no value); float and bool are
    refused, since a float id may have lost digits and a bool is a mask passed by mistake.
    """
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    ids = ids.long()
    if _VALUE_CHECKS and ids.numel():
        bad = (ids < 0) | (ids >= vocab)
        if ignore_index is not None:
            bad &= ids != ignore_index
        if bool(bad.any()):
            allowed = f"[0, {vocab})" + ("" if ignore_index is None else f" or {ignore_index}")
            raise ValueError(
                f"{name} must be token ids in {allowed}, got values outside that range")
    return ids


def check_same_shape(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """`x` must be a tensor of exactly the shape of `ref` (no broadcasting: it hides bugs)."""
    check_tensor(name, x)
    if x.shape != ref.shape:
        raise ValueError(
            f"{name} must have the same shape as {ref_name} {tuple(ref.shape)}, got "
            f"{tuple(x.shape)}"
        )


def check_finite(name: str, x: torch.Tensor) -> None:
    """`x` must hold no NaN or inf (a single non-finite value poisons every masked mean)."""
    if _VALUE_CHECKS and x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise NonFiniteError(f"{name} must be finite, but it contains NaN or inf")


def check_no_nan(what: str, x: torch.Tensor) -> None:
    """NonFiniteError: how many values of `x` are NaN or inf (a PPO run's guard adds the step)."""
    if not bool(torch.isfinite(x).all()):
        raise NonFiniteError(f"{what} has {int((~torch.isfinite(x)).sum())} NaN/inf value(s)")


def check_no_negative(name: str, x: torch.Tensor, why: str) -> None:
    """`x` must hold no negative value; `why` says what x is (e.g. "a probability ratio")."""
    if _VALUE_CHECKS and bool((x < 0).any()):
        raise ValueError(f"{name} must be >= 0 ({why}), but it has negative values")


def check_mask(name: str, mask: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """`mask` must have the shape of `ref` and hold only 0 and 1 (bool masks are fine)."""
    check_same_shape(name, mask, ref_name, ref)
    if _VALUE_CHECKS and mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError(f"{name} must contain only 0 and 1 (1 = real token, 0 = padding)")


def check_mask_nonempty(name: str, mask: torch.Tensor, dim: int | None = None) -> None:
    """`mask` must have at least one 1 (in every slice along `dim` when `dim` is given)."""
    if not _VALUE_CHECKS:
        return
    if dim is None:
        if not bool(mask.any()):
            raise ValueError(f"{name} is all zero: a masked mean needs at least one real token")
    elif not bool(mask.bool().any(dim=dim).all()):
        raise ValueError(
            f"{name} has a slice along dim {dim} with no real token: its masked mean is undefined"
        )


def check_mask_contiguous(name: str, mask: torch.Tensor) -> None:
    """Each row of a (B, T) mask must be one block of ones (e.g. 0 0 1 1 1 0), or all zero.

    Right padding (1 1 1 0 0) is the usual case; a leading block of zeros (prompt tokens) is fine
    too. A row with holes (1 0 1) has no single "last real token": GAE and reward shaping refuse it.
    """
    if not _VALUE_CHECKS:
        return
    m = mask.to(torch.int8)  # (B, T)
    starts = (m[:, 1:] > m[:, :-1]).sum(dim=1) + m[:, 0]  # (B,): number of 0 -> 1 edges per row
    if bool((starts > 1).any()):
        raise ValueError(
            f"{name} must be one contiguous block of ones per row (e.g. 1 1 1 0 0); "
            f"a row with holes such as 1 0 1 is not supported"
        )


def check_positive(name: str, value: float) -> None:
    """`value` must be a finite number > 0 (e.g. a clip epsilon or a variance epsilon)."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def check_finite_number(name: str, value: float) -> None:
    """`value` must be a finite real number of any sign (e.g. a reward-model margin)."""
    if not _is_number(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_nonnegative(name: str, value: float) -> None:
    """`value` must be a finite number >= 0 (e.g. a KL coefficient)."""
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def check_unit_interval(name: str, value: float) -> None:
    """`value` must be a number in [0, 1] (a discount or a GAE lambda)."""
    if not _is_number(value) or not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def check_greater_than_one(name: str, value: float) -> None:
    """`value` must be a finite number > 1 (the dual-clip constant)."""
    if not _is_number(value) or not math.isfinite(value) or value <= 1:
        raise ValueError(f"{name} must be a finite number > 1, got {value!r}")


def check_token_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """input_ids (B, L) and a same-shaped attention mask with at least one real token per row."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape (B, L), got {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must have the shape of input_ids "
                         f"{tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}")
    if not bool(attention_mask.bool().any(dim=1).all()):
        raise ValueError("attention_mask has a row with no real token")


def check_temperature(temperature: float) -> None:
    """A sampling temperature: a finite number > 0 (not a bool)."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) \
            or not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
