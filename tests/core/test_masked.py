"""Masked reductions equal the plain reductions on the real-token slice; whitening over the mask."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_helpers import masked_mean, masked_sum, masked_var, masked_whiten


def real_values(x, mask):
    return x[mask.bool()]  # (N,): the unmasked slice


def test_sum_and_mean_equal_plain_ops_on_real_slice(make_batch):
    batch = make_batch(B=9, T=17, seed=1, pad_value=1e6)
    x, mask = batch["x"], batch["mask"]
    real = real_values(x, mask)
    torch.testing.assert_close(masked_sum(x, mask), real.sum())
    torch.testing.assert_close(masked_mean(x, mask), real.mean())


def test_var_equals_plain_var_on_real_slice(make_batch):
    batch = make_batch(B=9, T=17, seed=2, pad_value=-1e6)
    x, mask = batch["x"], batch["mask"]
    real = real_values(x, mask)
    torch.testing.assert_close(masked_var(x, mask), real.var(unbiased=True))
    torch.testing.assert_close(masked_var(x, mask, unbiased=False), real.var(unbiased=False))


def test_per_row_sum_and_mean(make_batch):
    batch = make_batch(B=6, T=11, seed=3, pad_value=123.0)
    x, mask = batch["x"], batch["mask"]
    for b in range(x.shape[0]):
        row = x[b, : batch["lengths"][b]]
        torch.testing.assert_close(masked_sum(x, mask, dim=1)[b], row.sum())
        torch.testing.assert_close(masked_mean(x, mask, dim=1)[b], row.mean())
    # dim=0: per time step over the rows that reach it (min_len=T makes every column non-empty)
    full = make_batch(B=4, T=5, seed=4, min_len=5)
    torch.testing.assert_close(masked_mean(full["x"], full["mask"], dim=0), full["x"].mean(dim=0))


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 6), T=st.integers(2, 20), seed=st.integers(0, 10_000))
def test_property_mean_var_match_slice(make_batch, B, T, seed):
    batch = make_batch(B=B, T=T, seed=seed, min_len=2, pad_value=7.0)
    x, mask = batch["x"], batch["mask"]
    real = real_values(x, mask)
    torch.testing.assert_close(masked_mean(x, mask), real.mean())
    torch.testing.assert_close(masked_var(x, mask), real.var())


def test_whitened_mean_zero_variance_one_padding_zero(make_batch):
    batch = make_batch(B=10, T=30, seed=5, pad_value=50.0)
    x, mask = 3.0 + 4.0 * batch["x"], batch["mask"]
    white = masked_whiten(x, mask)
    real = real_values(white, mask)
    torch.testing.assert_close(real.mean(), torch.tensor(0.0, dtype=real.dtype), atol=1e-10, rtol=0)
    torch.testing.assert_close(real.var(), torch.tensor(1.0, dtype=real.dtype), atol=1e-6, rtol=0)
    assert (white[~mask.bool()] == 0).all()


def test_whiten_without_mean_shift_keeps_the_mean(make_batch):
    batch = make_batch(B=10, T=30, seed=6)
    x, mask = 3.0 + 4.0 * batch["x"], batch["mask"]
    white = masked_whiten(x, mask, shift_mean=False)
    real = real_values(white, mask)
    torch.testing.assert_close(real.mean(), real_values(x, mask).mean())
    torch.testing.assert_close(real.var(), torch.tensor(1.0, dtype=real.dtype), atol=1e-6, rtol=0)
    assert (white[~mask.bool()] == 0).all()


def test_whiten_ignores_padding_unlike_unmasked_whitening(make_batch):
    """The naive whitening over the full tensor gives a different answer: the mask matters."""
    batch = make_batch(B=8, T=20, seed=7)
    x, mask = 2.0 + batch["x"], batch["mask"]
    masked = masked_whiten(x, mask)
    naive = (x - x.mean()) / x.std() * mask
    assert not torch.allclose(masked, naive, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_mask_dtypes(make_batch, dtype):
    batch = make_batch(B=4, T=6, seed=8, dtype=torch.float32)
    x, mask = batch["x"], batch["mask"]
    torch.testing.assert_close(masked_mean(x, mask.to(dtype)), real_values(x, mask).mean())


# ---- half precision: accumulated in float32, returned in the input dtype ----------------------

HALF = [torch.float16, torch.bfloat16]


def half_tolerance(dtype):
    """Derived, not tuned: the float32 work adds a relative error of a few eps32 (~1e-6), then the
    result is rounded once to the half dtype: relative error <= eps/2 there. rtol = eps covers both
    with margin; atol = the smallest normal number covers results that round to a subnormal."""
    info = torch.finfo(dtype)
    return {"rtol": info.eps, "atol": info.tiny}


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_mean_and_sum_do_not_overflow(dtype):
    x = torch.full((10, 10), 1000.0, dtype=dtype)  # sum 1e5 > float16's max 65504
    mask = torch.ones(10, 10)
    got = masked_mean(x, mask)
    assert got.dtype == dtype and float(got) == 1000.0  # float16 used to give inf
    rows = masked_mean(x, mask, dim=1)
    assert rows.dtype == dtype and bool((rows == 1000.0).all())


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_reductions_match_a_float64_reference(make_batch, dtype):
    batch = make_batch(B=6, T=40, seed=4, dtype=torch.float64, pad_value=3.0)
    x = (1000.0 + 10.0 * batch["x"]).to(dtype)  # mean ~1000, std ~10: the float16 sum overflows
    mask = batch["mask"]
    ref = real_values(x.double(), mask)  # the same representable values, in float64
    for got, expected in ((masked_mean(x, mask), ref.mean()), (masked_var(x, mask), ref.var()),
                          (masked_var(x, mask, unbiased=False), ref.var(unbiased=False))):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), expected, **half_tolerance(dtype))
    white = masked_whiten(x, mask)
    assert white.dtype == dtype
    expected = ((x.double() - ref.mean()) / torch.sqrt(ref.var() + 1e-8)) * mask  # (B, T)
    torch.testing.assert_close(white.double(), expected, **half_tolerance(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_whiten_of_a_constant_is_zero_not_nan(dtype):
    """eps = 1e-8 underflows to 0 in float16, so var + eps = 0 and 0 * rsqrt(0) used to be NaN."""
    x = torch.full((2, 5), 3.0, dtype=dtype)
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    white = masked_whiten(x, mask)
    assert white.dtype == dtype and bool((white == 0).all())
    kept = masked_whiten(x, mask, shift_mean=False)
    assert bool((kept == 3.0 * mask).all())
