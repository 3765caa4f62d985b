"""Notebook 08's check (rlhf_helpers.course.capstone) on the toy world: a plain loop of one PPO
iteration matches the library's within the rounding budget, each plausible mistake is named with its
cause, the runs leave the model and the RNG as they were, and a pass belongs to the function objects
that passed."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from toy_world import TOY_WORDS, toy_causal_lm, toy_tokenizer
from transformers import GPT2Config

from rlhf_helpers.course import capstone
from rlhf_helpers.ppo.samples import sample_responses
from rlhf_helpers.ppo.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: every setting at a value of its own, as in the notebook's check
CONFIG = PPOConfig(rollout_batch_size=8, mini_batch_size=4, ppo_epochs=2, max_prompt_length=6,
                   max_new_tokens=8, temperature=0.7, kl_coef=0.15, gamma=0.95, lam=0.9,
                   clip_eps=0.25, value_clip=0.3, vf_coef=0.6,
                   max_grad_norm=1e6, lora=LoRASpec(r=4, alpha=8), progress_bar=False)
PROMPTS = [" ".join(TOY_WORDS[i : i + 3]) for i in range(8)]
SEEDS, LRS = (3, 4), (2.0, 0.05)


@dataclasses.dataclass
class Rollout:
    prompts: list
    responses: list
    sequences: torch.Tensor
    attention_mask: torch.Tensor
    context_length: int
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: torch.Tensor
    scores: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


def plain_iteration(model, tokenizer, prompts, policy_opt, value_opt, config,
                    generator, mistake=None):
    """The notebook's worked solution as one loop; `mistake` switches one plausible error on."""
    s = sample_responses(model, tokenizer, prompts, config.max_prompt_length, config.max_new_tokens,
                         temperature=config.temperature)
    seq, attn, P, mask = s.sequences, s.attention_mask, s.context_length, s.mask
    with torch.no_grad():
        logp = model.policy_logprobs(seq, attn, P, temperature=config.temperature).float()  # (B, R)
        ref = model.ref_logprobs(seq, attn, P, temperature=config.temperature).float()  # (B, R)
        values = model.values(seq, attn, P).float() * mask  # (B, R)
        scores = model.reward_scores(seq, attn).float()  # (B,)
    sign = 1.0 if mistake == "kl_sign" else -1.0
    rewards = sign * config.kl_coef * torch.where(mask.bool(), logp - ref, 0.0)  # (B, R)
    rewards[torch.arange(len(scores)), mask.sum(1).long() - 1] += scores
    B, T = rewards.shape
    adv, running, next_value = torch.zeros_like(rewards), torch.zeros(B), torch.zeros(B)
    for t in reversed(range(T)):
        running = (rewards[:, t] + config.gamma * next_value - values[:, t]
                   + config.gamma * config.lam * running)
        running = running * mask[:, t]
        adv[:, t], next_value = running, values[:, t]
    returns = adv + values
    real = adv[mask.bool()]
    if mistake != "no_whitening":
        adv = (adv - real.mean()) / torch.sqrt(real.var() + 1e-8) * mask
    batch = Rollout(s.prompts, s.responses, seq, attn, P, mask, logp, ref, values, scores,
                    rewards, adv, returns)
    losses, order = [], None
    for _ in range(config.ppo_epochs):
        order = (order if mistake == "one_shuffle" and order is not None
                 else torch.randperm(B, generator=generator))
        for first in range(0, B, config.mini_batch_size):
            rows = order[first : first + config.mini_batch_size]
            m, A, G, V_old = (mask[rows], batch.advantages[rows], batch.returns[rows],
                              batch.values[rows])
            old = (batch.ref_logprobs if mistake == "ratio_ref" else batch.old_logprobs)[rows]
            lp = model.policy_logprobs(seq[rows], attn[rows], P,
                                       temperature=config.temperature).float()
            rho = torch.exp(torch.where(m.bool(), lp - old, 0.0))
            eps = 0.2 if mistake == "band_0.2" else config.clip_eps
            clipped = rho.clamp(1 - eps, 1 + eps)
            clipped = clipped.detach() if mistake == "detach" else clipped
            pg = -(torch.min(rho * A, clipped * A) * m).sum() / m.sum()
            V = model.values(seq[rows], attn[rows], P).float()
            V_clip = V_old + (V - V_old).clamp(-config.value_clip, config.value_clip)
            vl = 0.5 * (torch.max((V - G) ** 2, (V_clip - G) ** 2) * m).sum() / m.sum()
            policy_opt.zero_grad()
            value_opt.zero_grad()
            (pg
             + {"no_vf_coef": 1.0, "vf_coef_0.5": 0.5}.get(mistake, config.vf_coef) * vl).backward()
            if mistake == "joint_clip":
                torch.nn.utils.clip_grad_norm_(model.policy_parameters() + model.value_parameters(),
                                               config.max_grad_norm)
            else:
                torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)
                torch.nn.utils.clip_grad_norm_(model.value_parameters(), config.max_grad_norm)
            policy_opt.step()
            value_opt.step()
            losses.append((pg.item(), vl.item()))
    return batch, losses


@pytest.fixture(scope="module")
def world():
    """A toy shared model whose policy adapter has moved away from the reference, and the library's
    two runs."""
    torch.set_num_threads(1)
    tok = toy_tokenizer()
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0), pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, seed=0, lora=CONFIG.lora)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for param in model.policy_parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=g))
    free = capstone.run_iteration(
        capstone.library_iteration, model, tok, PROMPTS, CONFIG, SEEDS, LRS)
    clipped_config = CONFIG.replace(max_grad_norm=0.5
                                    * min(free.step_norms["policy"] + free.step_norms["value"]))
    clipped = capstone.run_iteration(capstone.library_iteration, model, tok, PROMPTS,
                                     clipped_config, SEEDS, LRS)
    return model, tok, {"free": (CONFIG, free), "clipped": (clipped_config, clipped)}


def run_plain(world, setting, mistake=None):
    model, tok, runs = world
    config, expected = runs[setting]
    got = capstone.run_iteration(functools.partial(plain_iteration, mistake=mistake), model, tok,
                                 PROMPTS, config, SEEDS, LRS)
    return got, expected, config, capstone.rounding_rtol(model, config)


@pytest.mark.parametrize("setting", ["free", "clipped"])
def test_a_plain_loop_matches_the_library_well_inside_the_rounding_budget(world, setting):
    got, expected, config, rtol = run_plain(world, setting)
    assert capstone.first_difference(got, expected, config, rtol) is None
    # a margin of 20 at least
    assert capstone.first_difference(got, expected, config, rtol / 20) is None
    assert len(expected.losses) == 4 and expected.experience["old_logprobs"].abs().sum() > 0


def test_an_update_left_out_is_named_even_for_a_matrix_that_barely_moves(world):
    """The weights' check is relative to each matrix's own change (plus the float32 spacing of its
    weights), so a learner's step that skips a matrix is caught even where that matrix moves 10^4
    times less than the head."""
    got, expected, config, rtol = run_plain(world, "free")
    sizes = [float(update.abs().max()) for update in expected.updates["value"]]
    smallest = min(range(len(sizes)), key=sizes.__getitem__)
    assert 0 < sizes[smallest] < 1e-3 * max(sizes)  # a LoRA A whose B started at 0
    got.updates["value"][smallest] = torch.zeros_like(got.updates["value"][smallest])
    problem = capstone.first_difference(got, expected, config, rtol)
    assert problem is not None and "the value adapter's weights after the update differ" in problem


@pytest.mark.parametrize(("mistake", "setting", "named"), [
    ("kl_sign", "free", "check the sign"),
    ("no_whitening", "free", "not whitened"),
    ("ratio_ref", "free", "against the reference's log-probs"),
    ("detach", "free", "a .detach() on one branch"),
    ("no_vf_coef", "free", "with weight 1: scale it by config.vf_coef"),
    ("vf_coef_0.5", "free", "with weight 0.5: scale it by config.vf_coef"),
    ("band_0.2", "free", "clip(rho, 1 - config.clip_eps, 1 + config.clip_eps)"),
    ("one_shuffle", "free", "fresh shuffle"),
    ("joint_clip", "clipped", "one clip over both adapters"),
])
def test_each_mistake_is_named_with_its_cause(world, mistake, setting, named):
    got, expected, config, rtol = run_plain(world, setting, mistake)
    problem = capstone.first_difference(got, expected, config, rtol)
    assert problem is not None and named in problem, problem


def test_run_iteration_leaves_the_weights_and_the_rng_as_they_were(world):
    model, tok, _ = world
    weights = [p.detach().clone() for p in model.policy_parameters() + model.value_parameters()]
    state = torch.random.get_rng_state()
    record = capstone.run_iteration(plain_iteration, model, tok, PROMPTS, CONFIG, SEEDS, LRS)
    assert torch.equal(torch.random.get_rng_state(), state)
    for param, weight in zip(model.policy_parameters() + model.value_parameters(),
                             weights, strict=True):
        assert torch.equal(param.detach(), weight)
    assert len(record.step_norms["policy"]) == len(record.step_norms["value"]) == 4
    assert any(bool(update.abs().sum() > 0) for update in record.updates["policy"])


def test_the_rounding_budget_counts_the_roundings_of_the_longest_path():
    tiny = GPT2Config(n_embd=128, n_layer=3, n_head=4, vocab_size=403)

    class Stub:
        lm = type("LM", (), {"config": tiny})()
        compute_dtype = torch.float32

    config = PPOConfig(max_prompt_length=16, max_new_tokens=40)
    # norms, qkv, score, softmax/values, proj, mlp
    per_layer = 2 * 128 + 128 + 128 // 4 + 2 * 56 + 128 + 128 + 4 * 128
    # 4547 roundings
    assert capstone.rounding_rtol(Stub(), config) == (3 * per_layer + 2 * 128 + 403) * 2.0**-24
    Stub.compute_dtype = torch.bfloat16
    # the course's 16-bit rule
    assert capstone.rounding_rtol(Stub(), config) >= 8 * torch.finfo(torch.bfloat16).eps


def test_a_pass_belongs_to_the_function_objects_that_passed():
    def f():
        return 1

    passed = capstone.PassedCode()
    assert not passed.holds_for(f=f)
    # the check's in-place guard wraps the learner's function
    passed.record(f=functools.wraps(f)(lambda: f()))
    assert passed.holds_for(f=f)

    def f():  # noqa: F811  # the same code, redefined: another function, not checked yet
        return 1

    assert not passed.holds_for(f=f)


def test_left_out_settings_names_what_the_notebooks_iteration_does_not_implement():
    assert capstone.left_out_settings(PPOConfig()) == []
    assert capstone.left_out_settings(PPOConfig(entropy_coef=0.01, kl_kind="k3")) == [
        "entropy_coef=0.01",
                                                                                     "kl_kind='k3'"]
