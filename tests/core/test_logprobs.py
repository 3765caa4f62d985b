"""Per-token log-probs against log-softmax + gather by hand; entropy against known distributions."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_helpers import entropy_from_logits, logprobs_from_logits


def test_logprobs_match_log_softmax_gather_by_hand():
    torch.manual_seed(0)
    B, T, V = 3, 5, 11
    logits = 3 * torch.randn(B, T, V, dtype=torch.float64)
    labels = torch.randint(V, (B, T))
    out = logprobs_from_logits(logits, labels)
    assert out.shape == (B, T)
    for b in range(B):
        for t in range(T):
            row = logits[b, t]
            expected = row[labels[b, t]].item() - math.log(sum(math.exp(v) for v in row.tolist()))
            assert out[b, t].item() == pytest.approx(expected, abs=1e-12)


def test_logprobs_are_stable_for_huge_logits():
    logits = torch.tensor([[[1000.0, 0.0, -1000.0]]])  # (1, 1, 3): naive exp would overflow
    labels = torch.tensor([[1]])
    torch.testing.assert_close(logprobs_from_logits(logits, labels), torch.tensor([[-1000.0]]))


def test_logprobs_sum_to_one_over_the_vocabulary():
    torch.manual_seed(1)
    B, T, V = 2, 4, 7
    logits = torch.randn(B, T, V)
    total = sum(logprobs_from_logits(logits, torch.full((B, T), v)).exp() for v in range(V))
    torch.testing.assert_close(total, torch.ones(B, T))


def test_bfloat16_logits_computed_in_float32():
    torch.manual_seed(2)
    logits = torch.randn(2, 6, 50)
    labels = torch.randint(50, (2, 6))
    low = logprobs_from_logits(logits.bfloat16(), labels)
    assert low.dtype == torch.float32
    exact = torch.log_softmax(logits.bfloat16().float(), -1).gather(-1, labels[..., None])[..., 0]
    torch.testing.assert_close(low, exact)


def test_entropy_of_uniform_is_log_vocab():
    logits = torch.zeros(2, 3, 17) + torch.randn(2, 3, 1)  # constant per position: uniform
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(17)))


@pytest.mark.parametrize("p", [0.5, 0.1, 0.9, 1e-4])
def test_entropy_of_a_coin(p):
    logits = torch.tensor([[[math.log(p), math.log(1 - p)]]], dtype=torch.float64)  # (1, 1, 2)
    expected = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert entropy_from_logits(logits).item() == pytest.approx(expected, rel=1e-10)


def test_entropy_of_near_deterministic_is_zero_and_never_nan():
    logits = torch.tensor([[[500.0, -500.0, -500.0]]])
    ent = entropy_from_logits(logits)
    assert torch.isfinite(ent).all()
    assert ent.item() == pytest.approx(0.0, abs=1e-6)
