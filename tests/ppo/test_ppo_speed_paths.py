"""The PPO engine's speed paths compute what the plain paths compute (up to float rounding).

Each fast path (fused GELU, ...) is checked against an independent slow computation of the same
quantity: the untouched base model, a full-sequence forward, or the ungrouped loop order.
"""

from __future__ import annotations

import copy

import pytest
import torch
from toy_world import toy_causal_lm, toy_tokenizer

from rlhf_helpers.ppo.model.fused_lora import fuse_tanh_gelu
from rlhf_helpers.ppo.model.sampling import sample_model
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.lora import LoRASpec

TEXTS = ["the movie was good .", "the plot", "acting is great and the film was fine ."]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
    kept = SharedLoRAModel(
        toy_causal_lm(tok, seed=0), tok.pad_token_id, tok.eos_token_id, fused_gelu=False,
        packed=False, lora=LoRASpec(r=4, alpha=8))
    fused = SharedLoRAModel(toy_causal_lm(tok, seed=0), tok.pad_token_id, tok.eos_token_id,
                            lora=LoRASpec(r=4, alpha=8))
    with torch.no_grad():  # LoRA B starts at 0: the policy's logits are the base's
        assert torch.equal(kept.policy_logits(ids, attn), expected)
        got = fused.policy_logits(ids, attn)[attn.bool()]  # (N, V): the packed forward's pads are 0
    assert torch.allclose(got, expected[attn.bool()], atol=1e-5)
    # the swap did happen: float rounding differs somewhere
    assert not torch.equal(got, expected[attn.bool()])


def perturbed_shared(tok, seed: int = 1) -> SharedLoRAModel:
    """A shared model whose policy adapter is not the identity (LoRA B starts at 0)."""
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0), tok.pad_token_id, tok.eos_token_id,
                            lora=LoRASpec(r=4, alpha=8))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.adapter_parameters("policy"):
            param.copy_(0.3 * torch.randn(param.shape, generator=gen))
    return model


def test_a_deep_copy_of_the_fused_model_trains_its_own_adapters(tok):
    """Notebook 08's checks run each attempt on a deep copy: the copy's fused LoRA forward must
    use the copy's weights (a closure would keep the original's, and its gradients go there)."""
    model = perturbed_shared(tok)
    twin = copy.deepcopy(model)
    ids, attn = left_padded(tok, TEXTS)
    with torch.no_grad():
        twin.policy_parameters()[-1].add_(1.0)  # the copy's forward must see its own weights
        assert not torch.equal(twin.policy_logits(ids, attn), model.policy_logits(ids, attn))
    twin.policy_logprobs(ids, attn, 2).sum().backward()
    assert all(param.grad is not None for param in twin.policy_parameters())
    assert all(param.grad is None for param in model.parameters())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_a_fresh_full_forward(tok, temperature):
    model = perturbed_shared(tok)
    ids, attn = left_padded(tok, TEXTS + ["the", "the film"])
    torch.manual_seed(3)
    plain = sample_model(model, ids, attn, max_new_tokens=10, temperature=temperature).sequences
    torch.manual_seed(3)
    seq, logp, entropy = sample_model(model, ids, attn, max_new_tokens=10, temperature=temperature,
                                      with_logprobs=True)
    assert torch.equal(seq, plain)  # the same random draws
    P = ids.shape[1]
    mask = model.response_mask(seq[:, P:])  # (B, R) up to and including EOS
    assert 0 < mask.sum() < mask.numel()  # some rows stop early: the pad after EOS is exercised
    full_attn = torch.cat([attn, mask.long()], dim=1)  # (B, P + R)
    # an independent full pass of the distribution that sampled, softmax(z / T)
    with torch.no_grad():
        fresh, fresh_entropy = model.policy_logprobs(seq, full_attn, P, with_entropy=True,
                                                     temperature=temperature)
    assert logp.shape == entropy.shape == mask.shape
    assert torch.allclose(logp * mask, fresh * mask, atol=1e-5)
    assert torch.allclose(entropy * mask, fresh_entropy * mask, atol=1e-5)
    assert bool(torch.isfinite(logp).all()) and bool(torch.isfinite(entropy).all())


def test_sampling_logprobs_of_the_reference_are_the_reference_logprobs(tok):
    model = perturbed_shared(tok)
    ids, attn = left_padded(tok, TEXTS)
    torch.manual_seed(0)
    seq, logp, _ = sample_model(model, ids, attn, max_new_tokens=6, adapter=None,
                                with_logprobs=True)
    P = ids.shape[1]
    mask = model.response_mask(seq[:, P:])
    ref = model.ref_logprobs(seq, torch.cat([attn, mask.long()], dim=1), P)
    assert torch.allclose(logp * mask, ref * mask, atol=1e-5)
    policy = model.policy_logprobs(seq, torch.cat([attn, mask.long()], dim=1), P).detach()
    assert not torch.allclose(logp * mask, policy * mask, atol=1e-3)  # the adapter was really off


# ----------------------------------------------------------------------------- the update loop
PROMPTS = ["the movie was", "the film is", "the plot was", "the acting is", "the movie is great .",
           "the film was bad .", "the plot is fine", "the acting was good"]


@pytest.fixture
def make_trainer(make_trainer):
    """Toy trainers of this module: minibatches of 2 (4 per epoch), no hidden scorer; `tok`
    shared."""
    return lambda tok, **overrides: make_trainer(tokenizer=tok, mini_batch_size=2,
                                                 hidden_score_fn=None, **overrides)


def test_trim_minibatch_drops_only_all_padding_columns_and_keeps_every_output(make_trainer, tok):
    from rlhf_helpers.ppo.iteration import trim_minibatch

    trainer = make_trainer(tok)
    trainer.step()
    trainer.step()  # a trained policy and critic, so outputs are not the base's
    batch, model = trainer.last_batch, trainer.model
    P, R = batch.context_length, batch.mask.shape[1]
    lengths = batch.mask.sum(dim=1)  # (B,)
    prompt_lengths = batch.attention_mask[:, :P].sum(dim=1)  # (B,)
    rows = torch.tensor([int(lengths.argmin()), int(prompt_lengths.argmin())])
    mb = trim_minibatch(batch, rows)
    # the expected cut, by a loop over the columns
    keep = [c for c in range(P + R) if any(batch.attention_mask[int(r), c] for r in rows)]
    assert mb.sequences.shape[1] == keep[-1] - keep[0] + 1 < P + R  # something was cut here
    assert mb.context_length == P - keep[0]
    assert torch.equal(mb.mask.sum(dim=1), lengths[rows])  # no real token lost
    with torch.no_grad():
        full_logp = model.policy_logprobs(batch.sequences[rows], batch.attention_mask[rows], P)
        full_values = model.values(batch.sequences[rows], batch.attention_mask[rows], P)
        cut_logp = model.policy_logprobs(mb.sequences, mb.attention_mask, mb.context_length)
        cut_values = model.values(mb.sequences, mb.attention_mask, mb.context_length)
    r = mb.mask.shape[1]
    assert torch.allclose(cut_logp * mb.mask, full_logp[:, :r] * mb.mask, atol=1e-5)
    assert torch.allclose(cut_values * mb.mask, full_values[:, :r] * mb.mask, atol=1e-5)
    assert float(batch.mask[rows][:, r:].abs().sum()) == 0.0  # only padding beyond the cut


def reference_update(trainer, batch, generator) -> None:
    """The update as a plain loop: per minibatch a policy step then a value step, uncut rows."""
    from rlhf_helpers.core.losses import policy_loss, value_loss

    config, model = trainer.config, trainer.model
    P = batch.context_length
    for _ in range(config.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for first in range(0, len(batch), config.mini_batch_size):
            idx = order[first : first + config.mini_batch_size]
            seq, attn, mask = batch.sequences[idx], batch.attention_mask[idx], batch.mask[idx]
            logp = model.policy_logprobs(seq, attn, P)
            loss, _ = policy_loss(logp, batch.old_logprobs[idx], batch.advantages[idx], mask,
                                  clip_eps=config.clip_eps)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)
            trainer.policy_opt.optimizer.step()
            trainer.policy_opt.optimizer.zero_grad(set_to_none=True)
            values = model.values(seq, attn, P)
            v_loss, _ = value_loss(values, batch.values[idx], batch.returns[idx], mask,
                                   value_clip=config.value_clip)
            (config.vf_coef * v_loss).backward()
            torch.nn.utils.clip_grad_norm_(model.value_parameters(), config.max_grad_norm)
            trainer.value_opt.optimizer.step()
            trainer.value_opt.optimizer.zero_grad(set_to_none=True)


def trainable(trainer) -> list[torch.nn.Parameter]:
    return trainer.model.policy_parameters() + trainer.model.value_parameters()


def uncut_minibatch(batch, rows):
    """`trim_minibatch` without the cut: every column of the experience batch, as the plain loop."""
    from rlhf_helpers.ppo.iteration import Minibatch

    return Minibatch(sequences=batch.sequences[rows], attention_mask=batch.attention_mask[rows],
                     context_length=batch.context_length, mask=batch.mask[rows],
                     old_logprobs=batch.old_logprobs[rows], values=batch.values[rows],
                     advantages=batch.advantages[rows], returns=batch.returns[rows])


@pytest.mark.slow
def test_update_without_the_cut_is_bit_identical_to_the_plain_loop(make_trainer, tok, monkeypatch):
    """`PPOTrainer.update` = the plain alternating loop below, to the bit, with the real Adam.

    This holds on any CPU: both run the same float operations on the same inputs, and a CPU kernel
    given the same inputs, shapes and thread count returns the same bits.
    """
    from rlhf_helpers.ppo import iteration as trainer_module

    monkeypatch.setattr(trainer_module, "trim_minibatch", uncut_minibatch)
    fast, slow = make_trainer(tok), make_trainer(tok)
    for trainer in (fast, slow):
        trainer.step()  # identical first steps (same seed)
    assert torch.equal(fast.last_batch.sequences, slow.last_batch.sequences)
    before = [p.detach().clone() for p in trainable(fast)]
    fast.update(fast.last_batch, torch.Generator().manual_seed(7))
    reference_update(slow, slow.last_batch, torch.Generator().manual_seed(7))
    for a, b in zip(trainable(fast), trainable(slow), strict=True):
        assert torch.equal(a, b), float((a - b).abs().max())
    assert all(not torch.equal(a, b) for a, b in zip(trainable(fast), before, strict=True))


#: Tolerance of the cut-versus-uncut trajectory below, derived rather than tuned on one CPU.
#: Cutting padding columns changes only the blocking of float32 reductions, so each gradient
#: element differs by a few float32 roundings of the terms it sums: |dg| <= n eps32 sum|terms|
#: with n <~ 64 (hidden size, sequence length) and eps32 = 1.2e-7, i.e. <~ 1e-5 of the clipped
#: gradient (norm <= max_grad_norm = 1). SGD turns that into |dtheta| <= lr |dg| per step, with no
#: normalisation to amplify it (Adam divides by sqrt(v) + 1e-8 and turns a 1e-7 wobble of a
#: near-zero gradient into a step of up to lr: 2.5e-4 apart after 8 Adam steps at lr 5e-2 on an
#: AMD EPYC). 8 steps per parameter at lr 0.2 of a smooth loss (no ratio or value clipping, so no
#: kink where rounding could switch a token's gradient on or off): <= 8 * 0.2 * 1e-5 = 1.6e-5,
#: times the (1 + lr L)^8 growth of a smooth trajectory. atol 1e-4 covers that with margin; measured
#: 8e-8 (AMD EPYC, 1 and 2 threads). Every tensor moves by more than 3e-4, most by far more.
CUT_ATOL = 1e-4


@pytest.mark.slow
def test_cut_update_equals_the_uncut_plain_loop(make_trainer, tok):
    # clip_eps 1e3 and no value clip: a smooth objective (see CUT_ATOL); the clipping itself is
    # elementwise on real tokens, which the cut does not touch (tests/core/test_losses.py covers it)
    fast, slow = (make_trainer(tok, clip_eps=1e3, value_clip=None) for _ in range(2))
    for trainer in (fast, slow):
        trainer.step()  # identical first steps (same seed)
        # SGD: a step linear in the gradient, so rounding is not amplified (see CUT_ATOL)
        trainer.policy_opt.optimizer = torch.optim.SGD(trainer.model.policy_parameters(), lr=0.2)
        trainer.value_opt.optimizer = torch.optim.SGD(trainer.model.value_parameters(), lr=0.2)
    batch = fast.last_batch
    assert torch.equal(batch.sequences, slow.last_batch.sequences)
    before = [p.detach().clone() for p in trainable(fast)]
    fast.update(batch, torch.Generator().manual_seed(7))
    reference_update(slow, slow.last_batch, torch.Generator().manual_seed(7))
    for a, b, start in zip(trainable(fast), trainable(slow), before, strict=True):
        diff = float((a - b).detach().abs().max())
        assert diff <= CUT_ATOL, diff
        # each tensor moved by far more than the tolerance: a wrong order or row would show
        assert float((a.detach() - start).abs().max()) > 2 * CUT_ATOL
    stats = fast.last_update_stats
    assert [(s["epoch"], s["minibatch"]) for s in stats] == [(e, m) for e in (0.0, 1.0)
                                                             for m in (0.0, 1.0, 2.0, 3.0)]


def test_entropy_without_grad_is_the_same_entropy_and_leaves_the_gradient_unchanged(tok):
    model = perturbed_shared(tok)
    ids, attn = left_padded(tok, TEXTS)
    grads = {}
    for entropy_grad in (True, False):
        logp, entropy = model.policy_logprobs(ids, attn, 2, with_entropy=True,
                                              entropy_grad=entropy_grad)
        assert entropy.requires_grad is entropy_grad
        (logp.mean() - 0.0 * entropy.mean()).backward()  # entropy_coef = 0, as in the trainer
        grads[entropy_grad] = (
            [p.grad.clone() for p in model.policy_parameters()], entropy.detach())
        model.peft.zero_grad(set_to_none=True)
    assert torch.equal(grads[True][1], grads[False][1])
    assert all(torch.equal(a, b) for a, b in zip(grads[True][0], grads[False][0], strict=True))


# ----------------------------------------------------------------------------- fused LoRA layers
class TwoLinear(torch.nn.Module):
    """A module with plain nn.Linear layers (the Llama-style base; GPT-2 uses Conv1D)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)
        self.out = torch.nn.Linear(5, 3, bias=False)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(x)))


def lora_pair(make, targets, fan_in_fan_out, n_layers):
    """Two identical peft models with random non-zero adapters; the second one fused."""
    from peft import get_peft_model

    from rlhf_helpers.ppo.model.adapters import lora_config
    from rlhf_helpers.ppo.model.fused_lora import fuse_lora_layers

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = get_peft_model(make(), lora_config(4, 8, targets, fan_in_fan_out, task_type=None))
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.copy_(0.3 * torch.randn(param.shape, generator=gen))
        models.append(model)
    assert fuse_lora_layers(models[1]) == len(targets) * n_layers  # every targeted layer
    return models


def outputs_and_grads(model, x):
    x = x.clone().requires_grad_(True)
    out = model(x) if not hasattr(model, "transformer") else model(inputs_embeds=x).logits
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    lora = {n: p.grad.clone() for n, p in model.named_parameters() if "lora_" in n}
    model.zero_grad(set_to_none=True)
    return out.detach(), x.grad, lora


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_fused_lora_layer_gives_peft_outputs_and_gradients(tok, kind):
    if kind == "linear":
        peft_model, fused = lora_pair(TwoLinear, ["fc", "out"], False, 1)
        x = torch.randn(3, 4, 6)
    else:  # GPT-2: every block's c_attn, c_proj, c_fc are Conv1D (fan_in_fan_out)
        peft_model, fused = lora_pair(
            lambda: toy_causal_lm(tok, seed=0), ["c_attn", "c_fc"], True, 2)
        x = torch.randn(2, 5, peft_model.config.n_embd)
    expected, expected_dx, expected_lora = outputs_and_grads(peft_model, x)
    got, dx, lora = outputs_and_grads(fused, x)
    # the fused path ran
    assert torch.allclose(got, expected, atol=1e-5) and not torch.equal(got, expected)
    assert torch.allclose(dx, expected_dx, atol=1e-5)
    assert lora.keys() == expected_lora.keys() and len(lora) > 0
    for name, grad in lora.items():
        assert torch.allclose(grad, expected_lora[name], atol=1e-5, rtol=1e-4), name
    with torch.no_grad():  # the no-grad path (sampling, rollouts) is the same function
        again = fused(x) if kind == "linear" else fused(inputs_embeds=x).logits
    assert torch.allclose(again, got, atol=1e-6)
    # the exact base, untouched
    with peft_model.disable_adapter(), fused.disable_adapter(), torch.no_grad():
        base = peft_model(x) if kind == "linear" else peft_model(inputs_embeds=x).logits
        assert torch.equal(fused(x) if kind == "linear" else fused(inputs_embeds=x).logits, base)


def test_fused_lora_keeps_peft_forward_in_low_precision():
    peft_model, fused = lora_pair(TwoLinear, ["fc", "out"], False, 1)
    peft_model.to(torch.bfloat16)
    fused.to(torch.bfloat16)
    x = torch.randn(3, 6, dtype=torch.bfloat16)
    with torch.no_grad():
        # bf16 would round the folded update away: not fused
        assert torch.equal(fused(x), peft_model(x))


def test_shared_model_with_fused_lora_matches_peft_forward(tok):
    ids, attn = left_padded(tok, TEXTS)
    models = []
    for fused in (False, True):
        model = SharedLoRAModel(toy_causal_lm(tok, seed=0), tok.pad_token_id, tok.eos_token_id,
                                fused_lora=fused, lora=LoRASpec(r=4, alpha=8))
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for adapter in ("policy", "value"):
                for param in model.adapter_parameters(adapter):
                    param.copy_(0.3 * torch.randn(param.shape, generator=gen))
        models.append(model)
    results = []
    for model in models:
        logp = model.policy_logprobs(ids, attn, 2)
        logp.sum().backward()
        values = model.values(ids, attn, 2)
        values.sum().backward()
        grads = [p.grad for p in model.policy_parameters() + model.value_parameters()]
        results.append((logp.detach(), values.detach(), grads, model.ref_logprobs(ids, attn, 2)))
    (logp0, v0, g0, ref0), (logp1, v1, g1, ref1) = results
    assert torch.allclose(logp1, logp0, atol=1e-5) and torch.allclose(v1, v0, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(g1, g0, strict=True))
    assert torch.equal(ref1, ref0)  # adapters off: the base weights were never touched
