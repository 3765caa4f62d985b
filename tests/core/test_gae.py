"""GAE: the vectorised version against the reverse loop, against closed forms at lambda = 0 and 1,
and against the lambda-return built from n-step returns."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlhf_helpers
from rlhf_helpers import compute_gae, gae_reference, td_errors
from rlhf_helpers.core import gae as gae_module

BOTH = [compute_gae, gae_reference]
SETTINGS = [(1.0, 0.95), (0.99, 0.0), (0.9, 1.0), (1.0, 1.0), (0.5, 0.3), (0.0, 0.7)]


def assert_gae_equal(rewards, values, mask, gamma, lam, **tol):
    adv, ret = compute_gae(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, ref_adv, **tol)
    torch.testing.assert_close(ret, ref_ret, **tol)


@pytest.mark.parametrize("gamma, lam", SETTINGS)
def test_vectorised_equals_reference_loop(make_batch, gamma, lam):
    batch = make_batch(B=12, T=40, seed=3)
    assert_gae_equal(batch["x"], batch["y"], batch["mask"], gamma, lam)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_path_equals_reference_loop(make_batch, monkeypatch, chunk):
    """Sequences longer than GAE_CHUNK are done chunk by chunk; the seams must not show."""
    monkeypatch.setattr(gae_module, "GAE_CHUNK", chunk)
    batch = make_batch(B=6, T=50, seed=4)
    for gamma, lam in [(1.0, 0.95), (0.9, 1.0), (0.99, 0.0)]:
        assert_gae_equal(batch["x"], batch["y"], batch["mask"], gamma, lam)


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 5),
    T=st.integers(1, 30),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    chunk=st.sampled_from([2, 5, 512]),
    data=st.data(),
)
def test_property_vectorised_equals_reference(B, T, gamma, lam, chunk, data):
    """Random shapes, gamma, lambda and layouts: right padding, empty rows, prompt zeros first."""
    starts = data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    ends = [data.draw(st.integers(s, T)) for s in starts]
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b, (s, e) in enumerate(zip(starts, ends, strict=True)):
        mask[b, s:e] = 1.0
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    rewards = torch.randn(B, T, generator=gen, dtype=torch.float64)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64)
    old_chunk = gae_module.GAE_CHUNK
    gae_module.GAE_CHUNK = chunk
    try:
        assert_gae_equal(rewards, values, mask, gamma, lam)
    finally:
        gae_module.GAE_CHUNK = old_chunk


def td_by_hand(rewards, values, lengths, gamma):
    """delta_t = r_t + gamma V_{t+1} - V_t on real tokens, V = 0 after the last one; python
    loops."""
    out = torch.zeros_like(rewards)
    for b, length in enumerate(lengths.tolist()):
        for t in range(length):
            next_value = values[b, t + 1].item() if t + 1 < length else 0.0
            out[b, t] = rewards[b, t].item() + gamma * next_value - values[b, t].item()
    return out


def discounted_return_by_hand(rewards, lengths, gamma):
    """G_t = sum_{k=0}^{L-1-t} gamma^k r_{t+k}, an independent double sum."""
    out = torch.zeros_like(rewards)
    for b, length in enumerate(lengths.tolist()):
        for t in range(length):
            out[b, t] = sum(gamma**k * rewards[b, t + k].item() for k in range(length - t))
    return out


@pytest.mark.parametrize("fn", BOTH)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_lambda_zero_gives_td_errors(make_batch, fn, gamma):
    batch = make_batch(B=7, T=15, seed=5, pad_value=1e3)
    adv, ret = fn(batch["x"], batch["y"], batch["mask"], gamma, 0.0)
    expected = td_by_hand(batch["x"], batch["y"], batch["lengths"], gamma)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(td_errors(batch["x"], batch["y"], batch["mask"], gamma), expected)
    torch.testing.assert_close(ret, (expected + batch["y"]) * batch["mask"])


@pytest.mark.parametrize("fn", BOTH)
@pytest.mark.parametrize("gamma", [1.0, 0.95])
def test_lambda_one_gives_monte_carlo_return_minus_value(make_batch, fn, gamma):
    batch = make_batch(B=7, T=15, seed=6, pad_value=-1e3)
    adv, ret = fn(batch["x"], batch["y"], batch["mask"], gamma, 1.0)
    mc = discounted_return_by_hand(batch["x"], batch["lengths"], gamma)
    torch.testing.assert_close(ret, mc)  # returns are the Monte-Carlo returns, whatever V is
    torch.testing.assert_close(adv, (mc - batch["y"]) * batch["mask"])


def test_returns_are_the_lambda_return(make_batch):
    """G^lambda = (1 - lam) sum_{n>=1} lam^(n-1) G^(n); past the end every G^(n) is the full
    return."""
    batch = make_batch(B=5, T=8, seed=7)
    rewards, values, lengths = batch["x"], batch["y"], batch["lengths"]
    gamma, lam = 0.9, 0.8
    expected = torch.zeros_like(rewards)
    for b, length in enumerate(lengths.tolist()):
        for t in range(length):
            def n_step(n, b=b, t=t, length=length):
                horizon = min(n, length - t)
                g = sum(gamma**k * rewards[b, t + k].item() for k in range(horizon))
                return g + (gamma**n * values[b, t + n].item() if t + n < length else 0.0)
            steps_left = length - t  # G^(n) for n >= steps_left is the full return
            total = sum((1 - lam) * lam ** (n - 1) * n_step(n) for n in range(1, steps_left))
            expected[b, t] = total + lam ** (steps_left - 1) * n_step(steps_left)
    _, ret = compute_gae(rewards, values, batch["mask"], gamma, lam)
    torch.testing.assert_close(ret, expected)


def test_padding_is_zero_and_ignored(make_batch):
    clean = make_batch(B=6, T=20, seed=8, pad_value=0.0)
    dirty = make_batch(B=6, T=20, seed=8, pad_value=1e6)
    adv_c, ret_c = compute_gae(clean["x"], clean["y"], clean["mask"], 0.99, 0.95)
    adv_d, ret_d = compute_gae(dirty["x"], dirty["y"], dirty["mask"], 0.99, 0.95)
    torch.testing.assert_close(adv_c, adv_d)
    torch.testing.assert_close(ret_c, ret_d)
    padding = ~clean["mask"].bool()
    assert padding.any()
    assert (adv_d[padding] == 0).all() and (ret_d[padding] == 0).all()


def test_empty_row_gives_zeros(make_mask):
    mask = make_mask(torch.tensor([3, 0, 5]), 5)
    rewards, values = torch.randn(3, 5), torch.randn(3, 5)
    adv, ret = compute_gae(rewards, values, mask, 1.0, 0.95)
    assert (adv[1] == 0).all() and (ret[1] == 0).all()
    assert (adv[0] != 0).any()


def test_bool_mask_same_as_float_mask(make_batch):
    batch = make_batch(B=4, T=9, seed=9)
    a_f, r_f = compute_gae(batch["x"], batch["y"], batch["mask"], 0.99, 0.9)
    a_b, r_b = compute_gae(batch["x"], batch["y"], batch["mask"].bool(), 0.99, 0.9)
    torch.testing.assert_close(a_f, a_b)
    torch.testing.assert_close(r_f, r_b)


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (1.0, 1e-3), (0.1, 0.01), (1.0, 0.0)])
def test_long_sequences_stay_finite_and_exact(gamma, lam):
    """T = 1500 (three chunks) in float64: no overflow or underflow trouble at either end of
    gamma*lam."""
    torch.manual_seed(10)
    B, T = 3, 1500
    rewards, values = torch.randn(B, T, dtype=torch.float64), torch.randn(B, T, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 1200:] = 0
    adv, ret = compute_gae(rewards, values, mask, gamma, lam)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


def test_float32_close_to_float64_and_half_keeps_dtype(make_batch):
    batch = make_batch(B=8, T=256, seed=11)
    adv64, _ = compute_gae(batch["x"], batch["y"], batch["mask"], 1.0, 0.95)
    adv32, _ = compute_gae(batch["x"].float(), batch["y"].float(), batch["mask"].float(), 1.0, 0.95)
    assert adv32.dtype == torch.float32
    torch.testing.assert_close(adv32.double(), adv64, rtol=1e-5, atol=1e-4)
    adv16, ret16 = compute_gae(
        batch["x"].bfloat16(), batch["y"].bfloat16(), batch["mask"], 1.0, 0.95)
    assert adv16.dtype == torch.bfloat16 and ret16.dtype == torch.bfloat16
    assert torch.isfinite(adv16.float()).all()


def test_package_root_exports_the_maths_core():
    """The root re-exports lazily; every public name must resolve to the submodule's object."""
    assert rlhf_helpers.compute_gae is compute_gae and rlhf_helpers.gae_reference is gae_reference
    assert sorted(rlhf_helpers.__all__) == sorted(rlhf_helpers._EXPORTS)
    for name in rlhf_helpers.__all__:
        assert callable(getattr(rlhf_helpers, name)), name
    with pytest.raises(AttributeError):
        rlhf_helpers.not_a_function  # noqa: B018
