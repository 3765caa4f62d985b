"""Shared fixtures: seeded random batches of right-padded, variable-length sequences."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def right_padded_mask(lengths: torch.Tensor, T: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B,) lengths -> (B, T) mask with ones on the first lengths[b] positions of row b."""
    return (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)


def random_batch(
    B: int,
    T: int,
    seed: int = 0,
    min_len: int = 1,
    dtype: torch.dtype = torch.float64,
    pad_value: float = 0.0,
) -> dict[str, torch.Tensor]:
    """A seeded batch: lengths (B,) in [min_len, T], mask (B, T), and three (B, T) normal tensors
    `x`, `y`, `z` (for rewards, values, log-prob noise...), whose padded positions hold `pad_value`
    (use a large one to prove that padding is ignored)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, T + 1, (B,), generator=gen)  # (B,)
    mask = right_padded_mask(lengths, T, dtype)  # (B, T)
    out = {"lengths": lengths, "mask": mask}
    for name in ("x", "y", "z"):
        data = torch.randn(B, T, generator=gen, dtype=dtype)  # (B, T)
        out[name] = torch.where(mask.bool(), data, torch.full_like(data, pad_value))
    return out


@pytest.fixture(scope="session")
def make_batch() -> Callable[..., dict[str, torch.Tensor]]:
    """The `random_batch` factory (session-scoped, so hypothesis tests may use it too)."""
    return random_batch


@pytest.fixture(scope="session")
def make_mask() -> Callable[..., torch.Tensor]:
    """The `right_padded_mask` factory: (lengths (B,), T) -> (B, T) mask."""
    return right_padded_mask


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (tiny models thrash on a busy 2-core box), restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
