"""The sampling loop: the static-cache fast decoder against the plain KV-cached loop, on the CPU.

The fast decoder (`StaticLlamaDecoder`) runs eagerly here (CUDA graphs need a GPU); what it computes
is the same on both devices: the Llama decode step written out over a static cache, with the LoRA
adapter folded into the weights. Same seed -> same random draws (the loop is shared), so the tokens
must be identical wherever the two decoders' logits agree to float32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from rlhf_helpers.ppo.model.fast_decoder import StaticLlamaDecoder, supports_fast_decoder
from rlhf_helpers.ppo.model.sampling import PlainDecoder, sample, sample_model
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.lora import LoRASpec

LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# float32 logits of a 2-layer model: each output sums ~100 products, so the two decoders' different
# orders of summation (folded W + sBA vs W x + s B (A x); SDPA over a static cache vs a dynamic one)
# differ by a few float32 eps (1.2e-7) relative to logits of size ~1; log-softmax adds as much
# again. 1e-5 is ~100 eps: far above that rounding, far below any real difference (a wrong position
# or mask moves log-probs by 1e-2 or more).
LOGPROB_ATOL = 1e-5


@pytest.fixture(scope="module")
def tokenizer():
    from rlhf_helpers.runtime.models import load_tokenizer
    from rlhf_helpers.runtime.profiles import get_profile

    return load_tokenizer(get_profile("tiny"))


def tiny_llama(tokenizer, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def shared(tokenizer):
    model = SharedLoRAModel(
        tiny_llama(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        fast_sampling=False,
        lora=LoRASpec(r=4, alpha=8, target_modules=LLAMA_TARGETS),
    )
    # LoRA B starts at zero (adapter = identity); give the policy a real adapter so folding it
    # matters
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.policy_parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def prompts(tokenizer):
    from rlhf_helpers.ppo.model.samples import tokenize_prompts

    texts = ["the film was", "a slow , quiet story about", "i", "the acting in this one was simply"]
    return tokenize_prompts(tokenizer, texts, 16, "cpu")  # (4, P) left-padded


def _sample_both(shared, ids, attn, adapter, temperature=1.0, new_tokens=12, seed=3):
    out = {}
    for fast in (False, True):
        shared.fast_sampling = fast
        torch.manual_seed(seed)
        out[fast] = sample_model(shared, ids, attn, new_tokens, temperature=temperature,
                                                  adapter=adapter, with_logprobs=True)
    shared.fast_sampling = False
    return out[False], out[True]


@pytest.mark.parametrize("adapter", ["policy", None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fast_decoder_gives_the_plain_loops_tokens_and_log_probs(shared, prompts,
                                                                 adapter, temperature):
    ids, attn = prompts
    (seq_p, logp_p, ent_p), (seq_f, logp_f, ent_f) = _sample_both(shared, ids, attn,
                                                                  adapter, temperature)
    assert seq_f.shape == seq_p.shape and torch.equal(seq_f, seq_p)
    mask = shared.response_mask(seq_p[:, ids.shape[1]:]).bool()
    assert mask.sum() > 8  # the comparison covers real tokens
    torch.testing.assert_close(logp_f[mask], logp_p[mask], atol=LOGPROB_ATOL, rtol=0)
    torch.testing.assert_close(ent_f[mask], ent_p[mask], atol=LOGPROB_ATOL, rtol=0)


def test_fast_decoder_log_probs_equal_a_full_forward_of_the_policy(shared, prompts):
    ids, attn = prompts
    _, (seq, logp, _) = _sample_both(shared, ids, attn, "policy")
    P = ids.shape[1]
    resp_mask = shared.response_mask(seq[:, P:])
    full_attn = torch.cat([attn, resp_mask.long()], dim=1)
    forward = shared.policy_logprobs(seq, full_attn, P)  # (B, R) one pass, peft's own LoRA forward
    real = resp_mask.bool()
    torch.testing.assert_close(logp[real], forward[real], atol=LOGPROB_ATOL, rtol=0)


def test_the_adapter_folded_in_is_the_one_asked_for(shared, prompts):
    """Reference and policy must sample differently (a stale fold would give the same logits)."""
    ids, attn = prompts
    _, (_, logp_ref, _) = _sample_both(shared, ids, attn, None)
    _, (_, logp_pol, _) = _sample_both(shared, ids, attn, "policy")
    assert (logp_ref[:, 0] - logp_pol[:, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("every", [2, 5, 64])
def test_reading_the_stop_flag_less_often_changes_nothing(shared, prompts, every):
    """Steps sampled after every row ended are all pad and are cut: same sequences and log-probs."""
    ids, attn = prompts
    shared.use("policy")
    results = []
    for check in (1, every):
        torch.manual_seed(5)
        results.append(sample(shared.lm, ids, attn, 30, eos_token_id=shared.eos_token_id,
                              pad_token_id=shared.pad_token_id, with_logprobs=True,
                              decoder=PlainDecoder(shared.lm), stop_check_every=check))
    assert torch.equal(results[0].sequences, results[1].sequences)
    assert torch.equal(results[0].logprobs, results[1].logprobs)


def test_fast_decoder_reuses_its_cache_across_prompt_widths(shared, prompts, tokenizer):
    """Two batches whose P + R round to the same width share one static cache (one graph on
    CUDA)."""
    ids, attn = prompts
    decoder = StaticLlamaDecoder(shared.lm)
    for width in (ids.shape[1], ids.shape[1] - 1):
        sub_ids, sub_attn = ids[:, -width:], attn[:, -width:]
        keep = sub_attn.any(dim=1)
        sub_attn = sub_attn.clone()
        sub_attn[~keep, -1] = 1  # every row keeps one real token
        torch.manual_seed(0)
        sample(shared.lm, sub_ids, sub_attn, 6, eos_token_id=shared.eos_token_id,
               pad_token_id=shared.pad_token_id, decoder=decoder)
    assert len(decoder.entries) == 1


def test_the_fast_path_needs_a_llama_family_model(tokenizer):
    from rlhf_helpers.runtime.models import load_causal_lm
    from rlhf_helpers.runtime.profiles import get_profile

    gpt2 = load_causal_lm(get_profile("tiny"))
    assert not supports_fast_decoder(gpt2)
    assert supports_fast_decoder(tiny_llama(tokenizer))
    with pytest.raises(ValueError, match="fast decoder needs a model of type"):
        StaticLlamaDecoder(gpt2)
    with pytest.raises(ValueError, match="fast_sampling=True needs a Llama-family model"):
        SharedLoRAModel(gpt2, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, fast_sampling=True)


def test_fast_sampling_is_off_by_default_on_the_cpu(shared, tokenizer):
    model = SharedLoRAModel(tiny_llama(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id,
                            lora=LoRASpec(target_modules=LLAMA_TARGETS))
    assert model.fast_sampling is False


def test_stop_check_every_must_be_positive(shared, prompts):
    ids, attn = prompts
    with pytest.raises(ValueError, match="stop_check_every must be >= 1"):
        sample(shared.lm, ids, attn, 4, eos_token_id=shared.eos_token_id,
               pad_token_id=shared.pad_token_id, stop_check_every=0)


def test_low_precision_rollouts_take_old_log_probs_from_the_training_forward(tokenizer):
    """In bf16 the one-token sampling products round differently from the update's forward, so the
    old log-probs must be that forward's: equal to `policy_logprobs` of the rollout, and (LoRA B = 0
    at the start: policy = reference, bit for bit) a KL of exactly 0 at step 0."""
    from rlhf_helpers.ppo.iteration import collect_experience
    from rlhf_helpers.ppo.model.samples import sampling_logprobs_are_exact
    from rlhf_helpers.runtime.models import load_causal_lm
    from rlhf_helpers.runtime.ppo_config import PPOConfig
    from rlhf_helpers.runtime.profiles import get_profile

    profile = get_profile("tiny", dtype="bfloat16")
    lm = load_causal_lm(profile)
    model = SharedLoRAModel(lm, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)
    assert model.compute_dtype == torch.bfloat16 and not sampling_logprobs_are_exact(model)
    config = PPOConfig(rollout_batch_size=8, mini_batch_size=4, max_new_tokens=12,
                       progress_bar=False)
    torch.manual_seed(0)
    batch = collect_experience(model, tokenizer, ["the film was", "i thought the plot"] * 4,
                               config, kl_coef=0.1)
    forward = model.policy_logprobs(batch.sequences, batch.attention_mask,
                                    batch.context_length).float()
    real = batch.mask.bool()
    assert torch.equal(batch.old_logprobs[real], forward[real])
    assert torch.equal(batch.kl[real], torch.zeros_like(batch.kl[real]))
    assert torch.isfinite(batch.entropy[real]).all() and (batch.entropy[real] > 0).all()


def test_float32_rollouts_keep_the_sampling_loops_log_probs(tokenizer):
    from rlhf_helpers.ppo.model.samples import sampling_logprobs_are_exact
    from rlhf_helpers.runtime.models import load_causal_lm
    from rlhf_helpers.runtime.profiles import get_profile

    model = SharedLoRAModel(load_causal_lm(get_profile("tiny")),
                            pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)
    assert sampling_logprobs_are_exact(model)
    model.fast_sampling = True  # folded weights round differently: recompute, even in float32
    assert not sampling_logprobs_are_exact(model)


def test_a_failing_fast_path_falls_back_to_the_plain_loop_with_the_same_draws(shared,
                                                                              prompts, monkeypatch):
    """Untested hardware must not break a notebook: an error inside the fast decoder warns once and
    the same call samples with the plain loop, from the RNG state it started with."""
    ids, attn = prompts
    shared.fast_sampling = False
    torch.manual_seed(9)
    expected = sample_model(shared, ids, attn, 8).sequences

    real_decode = StaticLlamaDecoder.decode
    calls = []

    def decode_failing_at_step_3(self, *args, **kwargs):  # after three rounds of random draws
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("operation not permitted when stream is capturing")
        return real_decode(self, *args, **kwargs)

    monkeypatch.setattr(StaticLlamaDecoder, "decode", decode_failing_at_step_3)
    shared.fast_sampling = True
    torch.manual_seed(9)
    with pytest.warns(RuntimeWarning, match="fast sampling failed .*RuntimeError"):
        got = sample_model(shared, ids, attn, 8).sequences
    assert torch.equal(got, expected) and shared.fast_sampling is False


def test_a_graph_whose_first_replay_disagrees_with_the_eager_step_is_dropped(shared, prompts):
    """The first replay of each graph is checked against the same step run eagerly. A stand-in graph
    that writes wrong logits (what a capture of a stale buffer would do) is caught: the decoder
    warns, drops its graphs, and returns the eager logits, so the samples equal the plain loop's."""
    ids, attn = prompts
    decoder = StaticLlamaDecoder(shared.lm, use_graphs=False)
    shared.use("policy")
    decoder.load_adapter("policy")
    torch.manual_seed(2)
    plain = sample(shared.lm, ids, attn, 6, eos_token_id=shared.eos_token_id,
                   pad_token_id=shared.pad_token_id, decoder=PlainDecoder(shared.lm))

    class WrongGraph:
        def __init__(self, entry):
            self.entry = entry

        def replay(self):
            self.entry.logits = torch.full_like(self.entry.logits, 3.0)

    decoder.prefill(ids, attn, 6)  # builds the entry
    entry = decoder.entry
    entry.logits = torch.zeros(ids.shape[0], shared.lm.config.vocab_size)
    entry.graph = WrongGraph(entry)
    torch.manual_seed(2)
    with pytest.warns(RuntimeWarning, match="CUDA graph of the fast decoder gave logits"):
        got = sample(shared.lm, ids, attn, 6, eos_token_id=shared.eos_token_id,
                     pad_token_id=shared.pad_token_id, decoder=decoder)
    assert torch.equal(got.sequences, plain.sequences)
    assert entry.graph is None and decoder.use_graphs is False


def test_bench_sampling_builds_under_gpu_checks_environment(monkeypatch):
    """bench_sampling loads the shipped tokenizer through the tiny profile; under
    tools/gpu_checks.sh's RLHF_PROFILE_OVERRIDES='{"weights": "random"}' that used to raise before
    any timing (first GPU run)."""
    from benchmarks.bench_sampling import build_model

    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "random"}')
    shared, tokenizer = build_model("cpu", torch.float32, small=True)
    assert shared.device.type == "cpu" and tokenizer.pad_token_id is not None
