"""close_tolerance: float32 checks keep their tolerances; a bf16 model's two correctly computed
paths pass under the bf16 tolerance, and a real bug (a position off by one) still fails it."""

from __future__ import annotations

import pytest
import torch

from rlhf_helpers.core.logprobs import logprobs_from_logits
from rlhf_helpers.core.tolerances import close_tolerance
from rlhf_helpers.runtime.models import load_causal_lm, load_tokenizer
from rlhf_helpers.runtime.profiles import get_profile

TEXTS = ["the movie was great . i loved the acting", "the plot is bad",
         "a film with a fine score and good actors ."]


def test_float32_keeps_its_own_tolerance_and_half_types_scale_with_eps():
    assert close_tolerance(torch.float32, atol=1e-5, rtol=1e-4) == {"atol": 1e-5, "rtol": 1e-4}
    assert close_tolerance(torch.float64) == {"atol": 1e-4, "rtol": 1e-4}
    bf16, fp16 = close_tolerance(torch.bfloat16), close_tolerance(torch.float16)
    # 8: 3 fewer mantissa bits
    ratio = torch.finfo(torch.bfloat16).eps / torch.finfo(torch.float16).eps
    assert (bf16["atol"] == pytest.approx(ratio * fp16["atol"])
            and bf16["rtol"] == pytest.approx(ratio * fp16["rtol"]))
    # never tighter
    assert fp16["atol"] > 1e-4 and close_tolerance(torch.float16, atol=1.0)["atol"] == 1.0
    with pytest.raises(ValueError, match="dtype"):
        close_tolerance(torch.int64)
    with pytest.raises(ValueError, match="atol"):
        close_tolerance(torch.float32, atol=-1.0)


def _response_logprobs(model, ids: torch.Tensor, attn: torch.Tensor,
                       shift: int = 0) -> torch.Tensor:
    """log pi(token t | tokens < t) for t >= 1 of left-padded rows: (B, L) -> (B, L - 1); `shift`
    moves the logits one position too far (the bug the notebooks' checks exist to catch)."""
    positions = (attn.cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn,
                       position_ids=positions).logits.float()  # (B, L, V)
    logits = torch.roll(logits, shifts=shift, dims=1)
    return logprobs_from_logits(logits[:, :-1], ids[:, 1:])  # (B, L - 1)


@pytest.mark.usefixtures("one_torch_thread")
def test_bf16_tolerance_accepts_rounding_and_rejects_a_shifted_position():
    profile = get_profile("tiny", dtype="bfloat16")
    model, tokenizer = load_causal_lm(profile), load_tokenizer(profile)
    assert next(model.parameters()).dtype is torch.bfloat16
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True, padding_side="left")
    ids, attn = batch["input_ids"], batch["attention_mask"]  # (B, L), (B, L)
    batched = _response_logprobs(model, ids, attn)  # (B, L - 1)
    tol = close_tolerance(torch.bfloat16)
    for row in range(len(TEXTS)):
        real = attn[row].bool()
        alone_ids = ids[row][real][None]  # (1, n): the same text without padding
        alone = _response_logprobs(model, alone_ids, torch.ones_like(alone_ids))[0]  # (n - 1,)
        n = alone.shape[0]
        torch.testing.assert_close(alone, batched[row, -n:], **tol)  # other padding: rounding only
        shifted = _response_logprobs(model, alone_ids, torch.ones_like(alone_ids), shift=1)[0]
        with pytest.raises(AssertionError):
            torch.testing.assert_close(shifted[1:], batched[row, -n + 1:], **tol)
