"""SharedLoRAModel: one base, four roles, checked against an independent plain base model.

The reference model here is a second, untouched copy of the same random toy GPT-2 (same seed), run
without padding and with its default position ids, so nothing of the shared model's code is reused.
"""

from __future__ import annotations

import pytest
import torch
from toy_world import toy_causal_lm, toy_tokenizer

from rlhf_helpers.core.tokens import position_ids_from_mask
from rlhf_helpers.ppo.model.sampling import sample_model
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.lora import LoRASpec

torch.set_num_threads(1)

SEED = 0
TEXTS = ["the movie was good .", "the plot", "acting is great and the film was fine ."]


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


def make_shared(tok, **kwargs) -> SharedLoRAModel:
    return SharedLoRAModel(
        toy_causal_lm(tok, seed=SEED), tok.pad_token_id, tok.eos_token_id, **kwargs,
        lora=LoRASpec(r=4, alpha=8)
    )


@pytest.fixture(scope="module")
def plain(tok):
    """An untouched copy of the base model (same weights as the shared model's base)."""
    return toy_causal_lm(tok, seed=SEED)


@pytest.fixture()
def shared(tok):
    return make_shared(tok)


def left_padded(tok, texts):
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left")
    return enc["input_ids"], enc["attention_mask"]


def plain_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """log p(x_t | x_<t) of one unpadded row (L,) -> (L - 1,), by log_softmax and indexing."""
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0]  # (L, V)
    logp = torch.log_softmax(logits.double(), dim=-1)  # (L, V)
    return torch.stack([logp[t - 1, ids[t]] for t in range(1, len(ids))]).float()  # (L - 1,)


def perturb_adapter(model: SharedLoRAModel, adapter: str, seed: int = 1) -> None:
    """Random non-zero LoRA matrices (LoRA B starts at 0, which would make every adapter a
    no-op)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.adapter_parameters(adapter):
            param.copy_(0.3 * torch.randn(param.shape, generator=gen))


def row_alone(ids: torch.Tensor, attn: torch.Tensor, row: int) -> torch.Tensor:
    return ids[row][attn[row].bool()]  # (L_row,)


def test_position_ids_start_at_first_real_token():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    assert torch.equal(position_ids_from_mask(mask), expected)


def test_reference_logprobs_equal_plain_base(tok, plain, shared):
    ids, attn = left_padded(tok, TEXTS)
    for adapter in ("policy", "value", "reward"):  # adapters that do something must not leak in
        perturb_adapter(shared, adapter)
    P = 2
    ref = shared.ref_logprobs(ids, attn, P)  # (B, L - P)
    for row in range(len(TEXTS)):
        alone = row_alone(ids, attn, row)
        expected = plain_logprobs(plain, alone)  # (L_row - 1,)
        n_pad = ids.shape[1] - len(alone)
        # response position t holds token P + t; in the unpadded row that is token P + t - n_pad
        for t in range(ref.shape[1]):
            j = P + t - n_pad
            if j >= 1:
                assert torch.allclose(ref[row, t], expected[j - 1], atol=1e-5), (row, t)


def test_policy_equals_base_before_training_and_differs_after_a_step(tok, plain, shared):
    ids, attn = left_padded(tok, TEXTS)
    P = 2
    ref = shared.ref_logprobs(ids, attn, P)
    logp = shared.policy_logprobs(ids, attn, P)
    assert torch.allclose(logp, ref, atol=1e-6)  # LoRA B = 0: the policy is the base
    optimizer = torch.optim.Adam(shared.policy_parameters(), lr=1e-2)
    (-shared.policy_logprobs(ids, attn, P).sum()).backward()
    optimizer.step()
    after = shared.policy_logprobs(ids, attn, P).detach()
    assert (after - ref).abs().max() > 1e-3
    assert torch.allclose(shared.ref_logprobs(ids, attn, P), ref)  # the reference did not move
    row = row_alone(ids, attn, 0)
    assert torch.allclose(plain_logprobs(plain, row)[-1], ref[0, -1], atol=1e-5)


def grads_by_group(model: SharedLoRAModel) -> dict[str, bool]:
    """For each parameter group: does any parameter hold a gradient?"""
    lora_ids = {id(p) for a in ("policy", "value", "reward") for p in model.adapter_parameters(a)}
    groups = {
        "policy": model.adapter_parameters("policy"),
        "value": model.adapter_parameters("value"),
        "reward": model.adapter_parameters("reward"),
        "value_head": list(model.value_head.parameters()),
        "score_head": list(model.score_head.parameters()),
        "base": [p for p in model.peft.parameters() if id(p) not in lora_ids],
    }
    return {name: any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params)
            for name, params in groups.items()}


def test_policy_loss_reaches_only_policy_and_value_loss_only_value(tok, shared):
    ids, attn = left_padded(tok, TEXTS)
    shared.policy_logprobs(ids, attn, 2).sum().backward()
    got = grads_by_group(shared)
    assert got == {"policy": True, "value": False, "reward": False, "value_head": False,
                   "score_head": False, "base": False}
    for p in shared.parameters():
        p.grad = None
    perturb_adapter(shared, "value")  # non-zero LoRA B so both LoRA matrices get gradients
    shared.values(ids, attn, 2).pow(2).sum().backward()
    got = grads_by_group(shared)
    assert got == {"policy": False, "value": True, "reward": False, "value_head": True,
                   "score_head": False, "base": False}


def test_parameters_are_chosen_by_adapter_name(shared):
    names = {id(p): n for n, p in shared.peft.named_parameters()}
    assert all(".policy." in names[id(p)] for p in shared.policy_parameters())
    value_lora = shared.value_parameters()[: len(shared.adapter_parameters("value"))]
    assert all(".value." in names[id(p)] for p in value_lora)
    head = {id(p) for p in shared.value_head.parameters()}
    assert head <= {id(p) for p in shared.value_parameters()}


@pytest.mark.parametrize("method", ["policy", "ref", "values", "reward", "generate", "policy"])
def test_requires_grad_by_adapter_after_every_switch(tok, shared, method):
    ids, attn = left_padded(tok, TEXTS)
    calls = {
        "policy": lambda: shared.policy_logprobs(ids, attn, 2),
        "ref": lambda: shared.ref_logprobs(ids, attn, 2),
        "values": lambda: shared.values(ids, attn, 2),
        "reward": lambda: shared.reward_scores(ids, attn),
        "generate": lambda: sample_model(shared, ids, attn, max_new_tokens=3,
                                         adapter="reward").sequences,
    }
    calls["values"]()  # start from another active adapter
    calls[method]()
    assert all(p.requires_grad for p in shared.adapter_parameters("policy"))
    assert all(p.requires_grad for p in shared.value_parameters())
    assert not any(p.requires_grad for p in shared.adapter_parameters("reward"))
    assert not any(p.requires_grad for p in shared.score_head.parameters())
    lora = {id(p) for a in ("policy", "value", "reward") for p in shared.adapter_parameters(a)}
    assert not any(p.requires_grad for p in shared.peft.parameters() if id(p) not in lora)


def test_left_padded_batch_matches_each_row_alone(tok, shared):
    for adapter in ("policy", "value"):
        perturb_adapter(shared, adapter, seed=3)
    ids, attn = left_padded(tok, TEXTS)
    P = 2
    logp = shared.policy_logprobs(ids, attn, P).detach()  # (B, R)
    ref = shared.ref_logprobs(ids, attn, P)  # (B, R)
    values = shared.values(ids, attn, P).detach()  # (B, R)
    for row in range(len(TEXTS)):
        alone = row_alone(ids, attn, row)[None]  # (1, L_row)
        ones = torch.ones_like(alone)
        n_pad = ids.shape[1] - alone.shape[1]
        if P - n_pad < 1:  # the row is shorter than the prompt window: compare its tail with P = 1
            p_alone, offset = 1, 1 + n_pad - P
        else:
            p_alone, offset = P - n_pad, 0
        got = {
            "policy": shared.policy_logprobs(alone, ones, p_alone).detach()[0],
            "ref": shared.ref_logprobs(alone, ones, p_alone)[0],
            "values": shared.values(alone, ones, p_alone).detach()[0],
        }
        for name, batched in (("policy", logp), ("ref", ref), ("values", values)):
            assert torch.allclose(batched[row, offset:], got[name], atol=1e-5), (name, row)


def test_reward_read_at_last_real_token_equals_sequence_alone(tok, shared):
    perturb_adapter(shared, "reward", seed=5)
    prompts, _ = left_padded(tok, ["the movie", "the plot was"])
    # responses of different lengths: row 0 ends with EOS then pad (right padding after EOS)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    good, bad = tok.convert_tokens_to_ids(["good", "bad"])
    responses = torch.tensor([[good, eos, pad, pad], [bad, bad, good, eos]])
    ids = torch.cat([prompts, responses], dim=1)  # (2, P + 4)
    attn = torch.cat([(prompts != pad).long(), (responses != pad).long()], dim=1)  # (2, P + 4)
    scores = shared.reward_scores(ids, attn)  # (2,)
    for row in range(2):
        alone = row_alone(ids, attn, row)[None]
        single = shared.reward_scores(alone, torch.ones_like(alone))  # (1,)
        assert torch.allclose(scores[row], single[0], atol=1e-5)
    # an independent read: the reward adapter's last hidden state of the row alone through the head
    alone = row_alone(ids, attn, 0)[None]
    with torch.no_grad():
        shared.use("reward")
        hidden = shared.backbone(input_ids=alone).last_hidden_state[0, -1]  # (H,)
        expected = hidden @ shared.score_head.linear.weight[0]
    assert torch.allclose(scores[0], expected, atol=1e-5)
    assert not torch.allclose(scores[0], scores[1])


def test_dropout_stays_off(tok):
    shared = SharedLoRAModel(toy_causal_lm(tok, resid_pdrop=0.5, attn_pdrop=0.5, embd_pdrop=0.5),
                             tok.pad_token_id, tok.eos_token_id, lora=LoRASpec(r=4, alpha=8))
    shared.train()  # a no-op by design
    ids, attn = left_padded(tok, TEXTS)
    first = shared.policy_logprobs(ids, attn, 2).detach()
    assert torch.equal(first, shared.policy_logprobs(ids, attn, 2).detach())


def test_generate_pads_after_eos_and_mask_covers_through_eos(tok, shared):
    ids, attn = left_padded(tok, TEXTS)
    torch.manual_seed(0)
    seq = sample_model(shared, ids, attn, max_new_tokens=12).sequences
    responses = seq[:, ids.shape[1]:]  # (B, R)
    mask = shared.response_mask(responses)
    for row in range(responses.shape[0]):
        tokens = responses[row].tolist()
        if tok.eos_token_id in tokens:
            end = tokens.index(tok.eos_token_id)
            assert all(t == tok.pad_token_id for t in tokens[end + 1:])
            assert mask[row].tolist() == [1.0] * (end + 1) + [0.0] * (len(tokens) - end - 1)
        else:
            assert mask[row].tolist() == [1.0] * len(tokens)
    # a sampled pad before any EOS is a real token: the mask has no holes
    pad, eos, good = tok.pad_token_id, tok.eos_token_id, tok.convert_tokens_to_ids("good")
    mask = shared.response_mask(torch.tensor([[good, pad, eos, pad]]))
    assert mask.tolist() == [[1.0, 1.0, 1.0, 0.0]]


def test_bad_construction_and_inputs_raise(tok, shared):
    with pytest.raises(ValueError, match="pad_token_id must differ"):
        SharedLoRAModel(toy_causal_lm(tok), tok.eos_token_id, tok.eos_token_id)
    base = toy_causal_lm(tok)
    base.activation_checkpointing_enable()
    with pytest.raises(ValueError, match="gradient checkpointing"):
        SharedLoRAModel(base, tok.pad_token_id, tok.eos_token_id)
    ids, attn = left_padded(tok, TEXTS)
    with pytest.raises(ValueError, match="context_length"):
        shared.policy_logprobs(ids, attn, ids.shape[1])
    with pytest.raises(ValueError, match="attention_mask"):
        shared.values(ids, attn[:, 1:], 2)
    empty = attn.clone()
    empty[0] = 0
    with pytest.raises(ValueError, match="no real token"):
        shared.reward_scores(ids, empty)
    with pytest.raises(ValueError, match="adapter"):
        shared.adapter_parameters("critic")


def test_checkpointing_switched_on_later_is_refused(tok, shared):
    ids, attn = left_padded(tok, TEXTS)
    shared.lm.activation_checkpointing_enable()
    with pytest.raises(ValueError, match="gradient checkpointing"):
        shared.values(ids, attn, 2)


def test_parameter_bytes_add_up(shared):
    sizes = shared.parameter_bytes()
    every = sum(p.numel() * p.element_size() for p in shared.parameters())
    assert sizes["total"] == every
    assert sizes["policy"] == sizes["value"] == sizes["reward"] > 0


def test_shipped_tiny_model_smoke():
    """build_shared_model on the shipped tiny SFT model: the reference is the plain SFT model."""
    from rlhf_helpers.ppo.model.build import build_shared_model
    from rlhf_helpers.runtime.models import load_causal_lm
    from rlhf_helpers.runtime.profiles import get_profile

    profile = get_profile("tiny")
    model, tokenizer = build_shared_model(profile, profile.ppo, reward_dir=None)
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    ids, attn = left_padded(tokenizer, ["Review of the horror film Night Lake:",
                                         "Review of the comedy Big Day: a fun film ."])
    ref = model.ref_logprobs(ids, attn, 4)
    plain = load_causal_lm(profile)
    row = row_alone(ids, attn, 1)
    assert torch.allclose(ref[1, -1], plain_logprobs(plain, row)[-1], atol=1e-5)
    assert torch.allclose(model.policy_logprobs(ids, attn, 4), ref, atol=1e-6)
    torch.manual_seed(0)
    seq = sample_model(model, ids, attn, max_new_tokens=5).sequences
    assert seq.shape[0] == 2 and 1 <= seq.shape[1] - ids.shape[1] <= 5
    assert model.reward_scores(seq, torch.ones_like(seq)).shape == (2,)


def test_tempered_generation_log_probs_equal_the_tempered_policy_log_probs(tok, shared):
    torch.manual_seed(0)
    prompt = tok(["the movie was", "the plot"], return_tensors="pt", padding=True,
                 padding_side="left")
    ids, attn = prompt["input_ids"], prompt["attention_mask"]
    seq, logp, ent = sample_model(shared, ids, attn, max_new_tokens=6, temperature=0.7,
                                  with_logprobs=True)
    P = ids.shape[1]
    mask = shared.response_mask(seq[:, P:]).bool()  # (B, R)
    full_attn = torch.cat([attn, mask.long()], dim=1)  # (B, P + R)
    fresh, fresh_ent = shared.policy_logprobs(seq, full_attn, P, with_entropy=True, temperature=0.7)
    # one KV-cached token at a time vs one full pass: float32 rounding of log-probs < 30 in size
    assert torch.allclose(logp[mask], fresh.detach()[mask], atol=1e-5)
    assert torch.allclose(ent[mask], fresh_ent.detach()[mask], atol=1e-5)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        shared.policy_logprobs(seq, full_attn, P, temperature=0.0)
