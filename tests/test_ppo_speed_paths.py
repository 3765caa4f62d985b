"""The PPO engine's speed paths compute what the plain paths compute (up to float rounding).

Each fast path (fused GELU, ...) is checked against an independent slow computation of the same
quantity: the untouched base model, a full-sequence forward, or the ungrouped loop order.
"""

from __future__ import annotations

import pytest
import torch

from rlhf_helpers.ppo.shared_model import SharedLoRAModel, fuse_tanh_gelu
from rlhf_helpers.ppo.testing import toy_causal_lm, toy_tokenizer

TEXTS = ["the movie was good .", "the plot", "acting is great and the film was fine ."]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


def left_padded(tok, texts):
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left")
    return enc["input_ids"], enc["attention_mask"]


def test_fused_gelu_swaps_every_gelu_new_and_keeps_the_logits(tok):
    from transformers.activations import NewGELUActivation

    plain = toy_causal_lm(tok, seed=0)
    fused = toy_causal_lm(tok, seed=0)
    assert fuse_tanh_gelu(fused) == plain.config.n_layer  # one MLP activation per block
    assert not any(isinstance(m, NewGELUActivation) for m in fused.modules())
    ids, attn = left_padded(tok, TEXTS)
    with torch.no_grad():
        expected = plain(input_ids=ids, attention_mask=attn).logits
        got = fused(input_ids=ids, attention_mask=attn).logits
    assert torch.allclose(got, expected, atol=1e-5)
    # the gradient of the fused kernel is the gelu_new formula's gradient too
    x = torch.linspace(-6, 6, 241, dtype=torch.float64, requires_grad=True)
    slow = torch.autograd.grad(NewGELUActivation()(x).sum(), x)[0]
    fast = torch.autograd.grad(fused.transformer.h[0].mlp.act(x).sum(), x)[0]
    assert torch.allclose(fast, slow, atol=1e-12)


def test_shared_model_fuses_by_default_and_keeps_the_base_bit_for_bit_when_asked(tok):
    ids, attn = left_padded(tok, TEXTS)
    positions = (attn.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = toy_causal_lm(tok, seed=0)(input_ids=ids, attention_mask=attn,
                                              position_ids=positions).logits  # (B, L, V)
    kept = SharedLoRAModel(toy_causal_lm(tok, seed=0), tok.pad_token_id, tok.eos_token_id, r=4,
                           lora_alpha=8, fused_gelu=False)
    fused = SharedLoRAModel(toy_causal_lm(tok, seed=0), tok.pad_token_id, tok.eos_token_id, r=4,
                            lora_alpha=8)
    with torch.no_grad():  # LoRA B starts at 0: the policy's logits are the base's
        assert torch.equal(kept.policy_logits(ids, attn), expected)
        got = fused.policy_logits(ids, attn)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.equal(got, expected)  # the swap did happen: float rounding differs somewhere
