"""Rollouts of the shared-LoRA PPO engine on the toy model: old log-probs, masks, reward shaping,
GAE, and the best-of-n baseline."""

from __future__ import annotations

import math

import pytest
import torch
from toy_world import toy_causal_lm, toy_tokenizer

from rlhf_helpers.compare.best_of_n import best_of_n, best_of_n_kl
from rlhf_helpers.core.checks import NonFiniteError
from rlhf_helpers.core.gae import gae_reference
from rlhf_helpers.core.kl import shape_rewards
from rlhf_helpers.core.masked import masked_whiten
from rlhf_helpers.ppo.iteration import collect_experience
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.ppo_config import PPOConfig

PROMPTS = ["the movie was", "the film is", "the plot was", "the acting is", "the movie is great .",
           "the film was bad .", "the plot is fine", "the acting was good"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_setup(seed: int = 0, **overrides):
    tok = toy_tokenizer()
    base = toy_causal_lm(tok, seed=seed)
    model = SharedLoRAModel(base, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                            seed=seed, lora=LoRASpec(r=4, alpha=8))
    values = dict(rollout_batch_size=8, mini_batch_size=4, ppo_epochs=2, max_prompt_length=6,
                  max_new_tokens=8, lora=LoRASpec(r=4, alpha=8), policy_lr=5e-2, value_lr=5e-2,
                  progress_bar=False, seed=seed)
    values.update(overrides)
    return PPOConfig(**values), model, tok


def test_old_logprobs_are_the_sampling_policy_not_the_reference():
    config, model, tok = toy_setup()
    # the LoRA B matrices start at 0: policy == reference, so first move the policy
    trainer = PPOTrainer(config, model, tok, PROMPTS, hidden_score_fn=None)
    trainer.step()
    torch.manual_seed(1)
    batch = collect_experience(model, tok, PROMPTS, config, kl_coef=0.1)
    seq, attn, P, mask = batch.sequences, batch.attention_mask, batch.context_length, batch.mask
    fresh = model.policy_logprobs(seq, attn, P).detach()  # (B, R) a fresh policy forward
    ref = model.ref_logprobs(seq, attn, P)  # (B, R)
    assert torch.allclose(batch.old_logprobs * mask, fresh * mask, atol=1e-6)
    assert torch.allclose(batch.ref_logprobs * mask, ref * mask, atol=1e-6)
    # the policy moved, so the reference's log-probs are a different thing
    assert float(((batch.old_logprobs - batch.ref_logprobs).abs() * mask).max()) > 1e-3


def test_rewards_and_advantages_equal_shaping_then_loop_gae():
    for whiten in (False, True):
        config, model, tok = toy_setup(whiten_advantages=whiten, gamma=0.9, lam=0.8)
        trainer = PPOTrainer(config, model, tok, PROMPTS, hidden_score_fn=None)
        trainer.step()  # move the policy and the critic away from their initial values
        torch.manual_seed(2)
        batch = collect_experience(model, tok, PROMPTS, config, kl_coef=0.3)
        mask = batch.mask
        rewards, kl = shape_rewards(batch.scores, batch.old_logprobs, batch.ref_logprobs, mask, 0.3)
        assert torch.allclose(batch.rewards, rewards, atol=1e-6)
        assert torch.allclose(batch.kl, kl, atol=1e-6)
        # the score sits on the last real token, the KL penalty on every real token
        last = mask.sum(dim=1).long() - 1  # (B,)
        rows = torch.arange(len(batch))
        assert torch.allclose(batch.rewards[rows, last] + 0.3 * kl[rows, last],
                              batch.scores, atol=1e-5)
        adv, ret = gae_reference(rewards.double(), batch.values.double(), mask.double(), 0.9, 0.8)
        assert torch.allclose(batch.returns.double(), ret, atol=1e-5)
        expected = masked_whiten(adv, mask.double()) if whiten else adv
        assert torch.allclose(batch.advantages.double() * mask, expected * mask, atol=1e-5)


def test_response_mask_stops_after_first_eos_and_texts_match():
    config, model, tok = toy_setup(max_new_tokens=12)
    torch.manual_seed(3)
    batch = collect_experience(model, tok, PROMPTS * 4, config, kl_coef=0.0)
    responses = batch.sequences[:, batch.context_length:]  # (B, R)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for row, row_mask, ended, text in zip(responses.tolist(), batch.mask.tolist(),
                                          batch.ended_with_eos.tolist(),
                                          batch.responses, strict=True):
        first_eos = row.index(eos) if eos in row else None
        n_real = first_eos + 1 if first_eos is not None else len(row)
        # one prefix block, EOS included
        assert row_mask == [1.0] * n_real + [0.0] * (len(row) - n_real)
        assert ended == (first_eos is not None)
        assert all(t == pad for t in row[n_real:])  # generate pads after EOS
        kept = [t for t in row[:n_real] if t not in (eos, pad)]
        assert text.split() == tok.decode(kept, skip_special_tokens=True).split()
    assert batch.ended_with_eos.any()  # the random toy model ends some responses early...
    assert (batch.attention_mask[:, batch.context_length:] == batch.mask).all()


def test_reward_fn_replaces_reward_adapter_and_bad_scores_raise():
    config, model, tok = toy_setup()

    def length_reward(prompts, responses):
        return [float(len(r.split())) for r in responses]

    torch.manual_seed(4)
    batch = collect_experience(model, tok, PROMPTS, config, kl_coef=0.0, reward_fn=length_reward)
    assert batch.scores.tolist() == [float(len(r.split())) for r in batch.responses]

    with pytest.raises(ValueError, match="reward_fn must return 8 scores"):
        collect_experience(model, tok, PROMPTS, config, kl_coef=0.0, reward_fn=lambda p, r: [1.0])
    with pytest.raises(NonFiniteError, match="reward scores has 1 NaN/inf value"):
        collect_experience(model, tok, PROMPTS, config, kl_coef=0.0,
                           reward_fn=lambda p, r: [math.nan] + [0.0] * (len(r) - 1))


def test_best_of_n_picks_the_highest_learned_reward():
    config, model, tok = toy_setup()

    def word_count(prompts, responses):  # a stand-in "learned reward" we can recompute
        return [float(len(r.split())) for r in responses]

    def has_good(prompts, responses):  # a stand-in hidden scorer
        return [float("good" in r.split()) for r in responses]

    result = best_of_n(model, tok, PROMPTS, n=5, max_new_tokens=8, max_prompt_length=6,
                       reward_fn=word_count, hidden_score_fn=has_good, seed=7)
    assert result.reward_scores.shape == (8, 5) and result.hidden_scores.shape == (8, 5)
    for i, row in enumerate(result.responses):
        assert len(row) == 5
        assert result.reward_scores[i].tolist() == [float(len(r.split())) for r in row]
        # argmax: first maximum
        best = max(range(5), key=lambda j: (result.reward_scores[i, j], -j))
        assert result.chosen_responses[i] == row[best]
        assert result.chosen_hidden_scores[i] == float("good" in row[best].split())
    # best-of-1 is the plain mean of the first samples; best-of-k's learned reward never decreases
    # with k
    assert result.hidden_mean(1) == pytest.approx(float(result.hidden_scores[:, 0].mean()))
    means = [result.reward_mean(k) for k in range(1, 6)]
    assert means == sorted(means)
    # the global RNG is untouched and a seed repeats the draw
    state = torch.random.get_rng_state()
    again = best_of_n(model, tok, PROMPTS, n=5, max_new_tokens=8, max_prompt_length=6,
                      reward_fn=word_count, hidden_score_fn=has_good, seed=7)
    assert again.responses == result.responses
    assert torch.equal(torch.random.get_rng_state(), state)
    with pytest.raises(ValueError, match="n must be a positive int"):
        best_of_n(model, tok, PROMPTS, n=0)
    with pytest.raises(ValueError, match="k must be in"):
        result.pick(6)


def test_best_of_n_kl_matches_the_exact_kl_of_a_fine_grid():
    # base: uniform over M items with distinct rewards; best-of-n picks item i (rank i) with
    # probability ((i + 1) / M)^n - (i / M)^n. Its exact KL to the uniform base tends to
    # log n - (n - 1) / n as M grows.
    M = 200_000
    ranks = torch.arange(M, dtype=torch.float64)
    for n in (1, 2, 4, 16):
        p = ((ranks + 1) / M) ** n - (ranks / M) ** n  # (M,)
        exact = float((p * torch.log(p * M)).sum())
        assert best_of_n_kl(n) == pytest.approx(exact, abs=2e-3)
    assert best_of_n_kl(4) == pytest.approx(0.636, abs=1e-3)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="n must be a positive int"):
            best_of_n_kl(bad)


def test_tempered_rollout_keeps_the_log_probs_of_the_distribution_that_sampled():
    """temperature 0.7: old and reference log-probs are both of softmax(z / 0.7), read off a plain
    forward here; the k1 KL is their difference (the KL between the two sampling distributions)."""
    T = 0.7
    config, model, tok = toy_setup(temperature=T)
    trainer = PPOTrainer(config, model, tok, PROMPTS, hidden_score_fn=None)
    trainer.step()  # move the policy off the reference (LoRA B starts at 0)
    torch.manual_seed(1)
    batch = collect_experience(model, tok, PROMPTS, config, kl_coef=0.1)
    seq, attn, P, mask = batch.sequences, batch.attention_mask, batch.context_length, batch.mask
    tokens = seq[:, P:]  # (B, R)
    with torch.no_grad():
        policy_z = model.policy_logits(seq, attn)[:, P - 1 : -1]  # (B, R, V)
        plain = toy_causal_lm(tok, seed=0)  # the reference: the base model without any adapter
        ref_pos = (attn.cumsum(1) - 1).clamp(min=0)
        ref_z = plain(input_ids=seq, attention_mask=attn,
                      position_ids=ref_pos).logits[:, P - 1 : -1]  # (B, R, V)

    def logp(z: torch.Tensor) -> torch.Tensor:  # log softmax(z / T) at the sampled tokens: (B, R)
        return torch.log_softmax(z / T, dim=-1).gather(-1, tokens[..., None])[..., 0]

    # log-probs of magnitude < 30 from a KV-cached loop vs a full pass (or the fused vs plain GELU)
    # differ by a few float32 ulps: 30 * 1.2e-7 * 8 < 3e-5. The wrong temperature is off by
    # |log p_T - log p_1|, here > 1e-2 (asserted), three orders of magnitude more.
    tol = 3e-5
    real = mask.bool()
    assert torch.allclose(batch.old_logprobs[real], logp(policy_z)[real], atol=tol)
    assert torch.allclose(batch.ref_logprobs[real], logp(ref_z)[real], atol=tol)
    untempered = torch.log_softmax(policy_z, dim=-1).gather(-1, tokens[..., None])[..., 0]
    assert float((batch.old_logprobs - untempered)[real].abs().max()) > 1e-2
    assert torch.allclose(batch.kl[real], (logp(policy_z) - logp(ref_z))[real], atol=2 * tol)
