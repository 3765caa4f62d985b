"""Tolerances of the notebooks' `torch.testing.assert_close` checks, by the dtype the model computes in.

    tol = close_tolerance(profile.torch_dtype, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scratch, library, **tol)

The checks compare two computations of the same model output that round differently: another
padding, another kernel, sums in another order. In float32 that rounding is ~1e-6 and the checks keep
their own tight float32 tolerances. In bf16 or fp16 (the gpu profile) each rounding costs up to eps/2
(bf16: eps = 2^-7 = 0.0078) and a model adds one per layer, so two correct paths drift far beyond a
float32 tolerance: a GPU run measured up to 0.15 nats between two bf16 log-prob paths of a 30-layer
SmolLM2. The half-precision bound below is a fixed number of eps: above that drift, and still far below
the errors the checks exist to catch (a position off by one, padding read as a token), which move a
log-prob or a score by whole units.
"""

from __future__ import annotations

import torch

#: atol of a 16-bit dtype, in units of its eps (bf16: 32 * 2^-7 = 0.25 nats; fp16: 0.03)
HALF_ATOL_EPS = 32
#: rtol of a 16-bit dtype, in units of its eps (bf16: 8 * 2^-7 = 6%; fp16: 0.8%)
HALF_RTOL_EPS = 8


def close_tolerance(dtype: torch.dtype, atol: float = 1e-4, rtol: float = 1e-4) -> dict[str, float]:
    """{"atol", "rtol"} for assert_close between two differently rounded computations in `dtype`.

    float32 / float64: `atol` and `rtol` as given (the check's own float32 tolerances). A 16-bit
    float (bfloat16, float16): at least HALF_ATOL_EPS and HALF_RTOL_EPS times its eps.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if not (atol >= 0 and rtol >= 0):
        raise ValueError(f"atol and rtol must be >= 0, got atol={atol!r}, rtol={rtol!r}")
    if torch.finfo(dtype).bits > 16:
        return {"atol": atol, "rtol": rtol}
    eps = torch.finfo(dtype).eps
    return {"atol": max(atol, HALF_ATOL_EPS * eps), "rtol": max(rtol, HALF_RTOL_EPS * eps)}
