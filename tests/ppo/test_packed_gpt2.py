"""GPT-2 on the real tokens only (`packed_gpt2`) and the sampler's cache decoder (`gpt2_decoder`)
compute what transformers' forward computes, at every real token.

Each is checked against transformers' own GPT-2 forward with the same LoRA adapters (peft's layers),
or against the plain sampling loop. In float64 the two differ only by the order of additions
(relative 1e-16 per operation over a 2-layer model: 1e-10 is far above that and far below any real
difference, which would be of the size of the activations); in float32 with the fused LoRA
layers by float32 rounding: 6e-8 relative per operation, on values of order 1, over the ~100
operations on the path from an embedding to a log-prob stays under 1e-5 (as in
tests/ppo/test_ppo_speed_paths.py), while a wrong token or position moves a log-prob by 1e-2 or
more.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from toy_world import toy_causal_lm, toy_tokenizer

from rlhf_helpers.ppo.model.gpt2_decoder import GPT2CacheDecoder
from rlhf_helpers.ppo.model.packed_gpt2 import (
    attention,
    causal_bias,
    packed_hidden,
    supports_packed,
)
from rlhf_helpers.ppo.model.sampling import PlainDecoder, sample
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.lora import LoRASpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ["the movie was good .", "the plot", "acting is great and the film was fine .", "good"]


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


def shared(tok, packed: bool, dtype=torch.float32) -> SharedLoRAModel:
    """A shared model whose policy and value adapters are not the identity (LoRA B starts at 0)."""
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0).to(dtype), tok.pad_token_id,
                            tok.eos_token_id, packed=packed, lora=LoRASpec(r=4, alpha=8))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for adapter in ("policy", "value", "reward"):
            for param in model.adapter_parameters(adapter):
                param.copy_(0.3 * torch.randn(param.shape, generator=gen, dtype=torch.float64))
    return model


def batch(tok, holes: bool = False):
    """Prompts left-padded, responses right-padded (a PPO rollout's layout); `holes`: one row with a
    masked token in the middle, which neither forward may read."""
    enc = tok(TEXTS, return_tensors="pt", padding=True, padding_side="left")
    ids, attn = enc["input_ids"], enc["attention_mask"]
    extra = torch.tensor([[5, 6, 7, 2, 0], [8, 2, 0, 0, 0], [9, 10, 11, 12, 2], [2, 0, 0, 0, 0]])
    ids = torch.cat([ids, extra], dim=1)
    attn = torch.cat([attn, (extra != 0).long()], dim=1)
    if holes:
        attn[2, 4] = 0
    return ids, attn


@pytest.mark.parametrize("holes", [False, True])
def test_packed_hidden_states_equal_transformers_forward_at_every_real_token(tok, holes):
    ids, attn = batch(tok, holes)
    real = attn.bool()
    for adapter in ("policy", "value", None):
        model = shared(tok, packed=False, dtype=torch.float64)
        model.use(adapter or "policy")
        with torch.no_grad(), (model.reference() if adapter is None else torch.enable_grad()):
            expected = model._hidden(ids, attn)  # transformers' forward
            got = packed_hidden(model.backbone, ids, attn)
        assert torch.allclose(got[real], expected[real], atol=1e-10, rtol=0), adapter
        assert torch.equal(got[~real], torch.zeros_like(got[~real]))  # padding: 0, never read


def test_packed_model_gives_transformers_log_probs_values_and_gradients(tok):
    """The whole shared model, float32 with its fused LoRA layers: the quantities PPO reads
    (log-probs, entropies, values, the reference, reward scores) and both adapters' gradients."""
    ids, attn = batch(tok)
    # the prompts' width: position P - 1 is real in every row (left padding)
    context = ids.shape[1] - 5
    mask = attn[:, context:].float()  # (B, R): the losses read real response tokens only
    results = []
    for packed in (False, True):
        model = shared(tok, packed)
        assert model.packed is packed
        logp, entropy = model.policy_logprobs(ids, attn, context, with_entropy=True)
        ((logp * mask).sum() + (entropy * mask).sum()).backward()
        values = model.values(ids, attn, context)
        ((values * mask) ** 2).sum().backward()
        grads = [p.grad.clone() for p in model.policy_parameters() + model.value_parameters()]
        results.append((logp[mask.bool()].detach(), entropy[mask.bool()].detach(),
                        values[mask.bool()].detach(),
                        model.ref_logprobs(ids, attn, context)[mask.bool()],
                        model.reward_scores(ids, attn), grads))
    names = ("logp", "entropy", "values", "ref", "reward")
    for name, plain, packed in zip(names, results[0], results[1], strict=False):
        assert torch.allclose(packed, plain, atol=1e-5), name
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a,
               b in zip(results[1][5], results[0][5], strict=True))
    # the packed path ran
    assert not all(torch.equal(a, b) for a, b in zip(results[1][5], results[0][5], strict=True))


def test_only_plain_gpt2_blocks_are_packed(tok):
    from test_sampling import tiny_llama

    assert supports_packed(toy_causal_lm(tok))
    assert not supports_packed(tiny_llama(tok))  # other architectures keep transformers' forward
    assert not supports_packed(toy_causal_lm(tok, scale_attn_by_inverse_layer_idx=True))
    assert not supports_packed(toy_causal_lm(tok, reorder_and_upcast_attn=True))
    assert not supports_packed(toy_causal_lm(tok).train())  # dropout would differ
    plain = SharedLoRAModel(tiny_llama(tok), tok.pad_token_id, tok.eos_token_id,
                            lora=LoRASpec(r=4, alpha=8, target_modules=("q_proj", "v_proj")))
    assert plain.packed is False


def test_attention_equals_torch_scaled_dot_product_attention():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    got = attention(q, k, v, causal_bias(6, torch.float64, q.device), 0.35)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.35)
    assert torch.allclose(got, expected, atol=1e-12)
    keep = torch.rand(3, 1, 1, 6, generator=gen) < 0.6
    keep[..., 0] = True  # every row reads at least one key
    bias = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    got = attention(q[:, :, :1], k, v, bias, 0.35)
    assert torch.allclose(got,
                          F.scaled_dot_product_attention(q[:, :, :1], k, v, attn_mask=keep,
                                                         scale=0.35), atol=1e-12)


@pytest.mark.parametrize("adapter", ["policy", None])
def test_cache_decoder_samples_the_plain_loops_tokens_and_log_probs(tok, adapter):
    """Same seed, same draws: the two decoders' logits agree to rounding, so every token is the
    same, rows that ended early included (their later tokens are pad and unattended)."""
    model = shared(tok, packed=True)
    enc = tok(TEXTS, return_tensors="pt", padding=True, padding_side="left")
    outs = []
    for decoder in (PlainDecoder, GPT2CacheDecoder):
        torch.manual_seed(3)
        model.use("policy")
        with torch.no_grad(), (model.reference() if adapter is None else torch.enable_grad()):
            outs.append(sample(model.lm, enc["input_ids"], enc["attention_mask"], 12,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                               with_logprobs=True, decoder=decoder(model.lm)))
    (plain, cached) = outs
    assert torch.equal(cached.sequences, plain.sequences)
    responses = plain.sequences[:, enc["input_ids"].shape[1]:]
    assert (responses == tok.eos_token_id).any(dim=1).sum() >= 1  # some row ended before the others
    assert torch.allclose(cached.logprobs, plain.logprobs, atol=1e-5)
    assert torch.allclose(cached.entropy, plain.entropy, atol=1e-5)


def test_logits_to_keep_means_what_it_means_in_transformers(tok):
    ids, attn = batch(tok)
    for packed in (False, True):
        model = shared(tok, packed)
        with torch.no_grad():
            full = model._logits(ids, attn)  # (B, L, V)
            # an int k: the last k (the LM head's product over fewer rows may round each one
            # differently: float32 rounding of logits of size ~1 summed over 32 terms, far below
            # 1e-5, and far below any wrong position's difference)
            assert torch.allclose(model._logits(ids, attn, 3), full[:, -3:], atol=1e-5)
            picked = torch.tensor([2, 5])
            # those positions
            assert torch.allclose(model._logits(ids, attn, picked), full[:, picked], atol=1e-5)
            # other positions would differ
            assert not torch.allclose(full[:, -3:], full[:, -4:-1], atol=1e-3)


def test_sampling_refuses_prompts_padded_on_the_right(tok):
    """The first token is drawn from the last column's logits: a right-padded prompt would draw it
    from a pad."""
    model = shared(tok, packed=True)
    enc = tok(TEXTS, return_tensors="pt", padding=True, padding_side="right")
    with pytest.raises(ValueError, match="attention_mask must be left-padded"):
        sample(model.lm, enc["input_ids"], enc["attention_mask"], 4, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
