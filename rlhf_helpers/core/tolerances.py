"""Tolerances of the notebooks' `torch.testing.assert_close` checks, by the model's compute dtype.

    tol = close_tolerance(profile.torch_dtype, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scratch, library, **tol)

The checks compare two computations of the same model output that round differently: another
padding, another kernel, sums in another order. In float32 that rounding is ~1e-6 and the checks
keep their own tight float32 tolerances. In bf16 or fp16 (the gpu profile) each rounding costs up to
eps/2 (bf16: eps = 2^-7 = 0.0078) and a model adds one per layer, so two correct paths drift far
beyond a float32 tolerance: a GPU run measured up to 0.15 nats between two bf16 log-prob paths of a
30-layer SmolLM2. The half-precision bound below is a fixed number of eps: above that drift, and
still far below the errors the checks exist to catch (a position off by one, padding read as a
token), which move a log-prob or a score by whole units.
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


# ---------------------------------------------------------------- the run doctor's comparisons
#: every spelling of a compute dtype -> its one name: "bf16", "torch.bfloat16", "bfloat16" are one
DTYPE_ALIASES: dict[str, str] = {
    **dict.fromkeys(("float32", "fp32", "float", "torch.float32", "torch.float"), "float32"),
    **dict.fromkeys(("float64", "fp64", "double", "torch.float64", "torch.double"), "float64"),
    **dict.fromkeys(("bfloat16", "bf16", "torch.bfloat16"), "bfloat16"),
    **dict.fromkeys(("float16", "fp16", "half", "torch.float16", "torch.half"), "float16"),
}
#: |first_ratio - 1| allowed in float32 and float64: two roundings of one computation (the course's
#: float32 tolerance); a correct update measured < 1.2e-7 on 60 tiny-profile steps
FLOAT32_RATIO_TOLERANCE = 1e-4
#: |first_ratio - 1| allowed in a 16-bit dtype, in units of its eps (bf16: 2^-7 / 8 = 9.8e-4; fp16:
#: 1.2e-4): a choice between measurements, not a bound. first_ratio is the mean of exp(d) over the
#: first minibatch's n tokens, d the difference of two 16-bit roundings of a log-prob (the sampler's
#: and the update's forwards, other shapes): its noise shrinks as 1/sqrt(n), and a bias of about
#: mean(d^2)/2 stays. Measured: at most 2.3e-4 on a healthy H200 bf16 run (random weights,
#: minibatches of 64 x ~20 tokens, 20 steps: 4x inside), exactly 0 on CPU bf16 and fp16 runs; the
#: reference used as the old log-probs gave 3.4e-3 or more once the policy had moved (toy runs, 3
#: seeds: 3.4x outside). 8 eps (0.0625 in bf16) misses that bug at every step. Not yet measured:
#: fp16 on a GPU, real weights on a GPU, minibatches of a few hundred tokens on a GPU.
HALF_RATIO_EPS = 1 / 8
#: a share of counts (eos_in_mask, zero_std_fraction) within this of 1 counts as 1: a share that
#: misses one count in n <= 10^5 is at most 1 - 1e-5, while float32 arithmetic on an exact 1 (CUDA's
#: mean: the sum times 1/n) errs by a few units of 2^-24 = 6e-8 (the H200 run logged 0.99999994)
SHARE_TOLERANCE = 1e-6
#: scores whose spread is at most this times max(1, |mean|) are equal, in float32/64: float32 keeps
#: equal scores equal and rounds different ones apart by more than its eps (1.2e-7). In a 16-bit
#: dtype: its eps.
FLOAT32_SPREAD_TOLERANCE = 1e-6


def dtype_name(dtype: str | torch.dtype) -> str:
    """The one name of a compute dtype ("float32", "float64", "bfloat16", "float16") from any
    spelling of it: a torch.dtype, "bf16", "torch.bfloat16"... An unknown name is a ValueError,
    never float32."""
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype)
    name = DTYPE_ALIASES.get(dtype.strip().lower()) if isinstance(dtype, str) else None
    if name is None:
        raise ValueError("dtype must be a floating dtype name "
                         f"({', '.join(sorted(set(DTYPE_ALIASES.values())))}, "
                         f"or bf16, fp16, fp32, torch.bfloat16...), got {dtype!r}")
    return name


def half_eps(dtype: str | torch.dtype) -> float | None:
    """eps of a 16-bit dtype (bf16: 2^-7, fp16: 2^-10); None for float32 and float64."""
    name = dtype_name(dtype)
    return torch.finfo(getattr(torch, name)).eps if name in ("bfloat16", "float16") else None


def ratio_tolerance(dtype: str | torch.dtype, float32: float = FLOAT32_RATIO_TOLERANCE) -> float:
    """|first_ratio - 1| a correct update may show in `dtype`: `float32` in float32/64, at least
    HALF_RATIO_EPS x eps in a 16-bit dtype (bf16: 9.8e-4, fp16: 1.2e-4)."""
    eps = half_eps(dtype)
    return float32 if eps is None else max(float32, HALF_RATIO_EPS * eps)


def spread_tolerance(dtype: str | torch.dtype, float32: float = FLOAT32_SPREAD_TOLERANCE) -> float:
    """Relative spread under which a batch's scores computed in `dtype` are equal: `float32` in
    float32/64, at least one eps in a 16-bit dtype (scores one rounding step apart are equal as far
    as the arithmetic can tell)."""
    eps = half_eps(dtype)
    return float32 if eps is None else max(float32, eps)
