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


def perturbed_shared(tok, seed: int = 1) -> SharedLoRAModel:
    """A shared model whose policy adapter is not the identity (LoRA B starts at 0)."""
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0), tok.pad_token_id, tok.eos_token_id, r=4, lora_alpha=8)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.adapter_parameters("policy"):
            param.copy_(0.3 * torch.randn(param.shape, generator=gen))
    return model


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_a_fresh_full_forward(tok, temperature):
    model = perturbed_shared(tok)
    ids, attn = left_padded(tok, TEXTS + ["the", "the film"])
    torch.manual_seed(3)
    plain = model.generate(ids, attn, max_new_tokens=10, temperature=temperature)
    torch.manual_seed(3)
    seq, logp, entropy = model.generate_with_logprobs(ids, attn, max_new_tokens=10, temperature=temperature)
    assert torch.equal(seq, plain)  # the same random draws
    P = ids.shape[1]
    mask = model.response_mask(seq[:, P:])  # (B, R) up to and including EOS
    assert 0 < mask.sum() < mask.numel()  # some rows stop early: the pad after EOS is exercised
    full_attn = torch.cat([attn, mask.long()], dim=1)  # (B, P + R)
    with torch.no_grad():  # an independent full pass, at temperature 1 whatever sampled the tokens
        fresh, fresh_entropy = model.policy_logprobs(seq, full_attn, P, with_entropy=True)
    assert logp.shape == entropy.shape == mask.shape
    assert torch.allclose(logp * mask, fresh * mask, atol=1e-5)
    assert torch.allclose(entropy * mask, fresh_entropy * mask, atol=1e-5)
    assert bool(torch.isfinite(logp).all()) and bool(torch.isfinite(entropy).all())


def test_sampling_logprobs_of_the_reference_are_the_reference_logprobs(tok):
    model = perturbed_shared(tok)
    ids, attn = left_padded(tok, TEXTS)
    torch.manual_seed(0)
    seq, logp, _ = model.generate_with_logprobs(ids, attn, max_new_tokens=6, adapter=None)
    P = ids.shape[1]
    mask = model.response_mask(seq[:, P:])
    ref = model.ref_logprobs(seq, torch.cat([attn, mask.long()], dim=1), P)
    assert torch.allclose(logp * mask, ref * mask, atol=1e-5)
    policy = model.policy_logprobs(seq, torch.cat([attn, mask.long()], dim=1), P).detach()
    assert not torch.allclose(logp * mask, policy * mask, atol=1e-3)  # the adapter was really off
