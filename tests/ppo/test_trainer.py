"""The PPO update loop on the toy model: ratio 1 at the start, the clip loss going down, NaN
handling with checkpoints, determinism, the KL controller, the ptx loss, value warm-up, config
validation."""

from __future__ import annotations

import math

import pytest
import torch
from toy_world import good_count

from rlhf_helpers.core.checks import NonFiniteError
from rlhf_helpers.core.kl import AdaptiveKLController, FixedKLController, shape_rewards
from rlhf_helpers.core.losses import policy_loss
from rlhf_helpers.ppo.checkpoints.save_load import latest_checkpoint, load_checkpoint
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.ppo_config import PPOConfig

PROMPTS = ["the movie was", "the film is", "the plot was", "the acting is", "the movie is great .",
           "the film was bad .", "the plot is fine", "the acting was good"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")



@pytest.fixture
def make_trainer(make_trainer):
    """Toy trainers of this module; `seed` seeds both the adapters' initialisation and the run."""
    return lambda seed=0, **overrides: make_trainer(init_seed=seed, seed=seed, **overrides)


def snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def changed(before, params) -> bool:
    return any(not torch.equal(a, p.detach()) for a, p in zip(before, params, strict=True))


def without_times(history):
    return [{k: v for k, v in m.items() if not k.startswith("time_")} for m in history]


def test_first_minibatch_has_ratio_one_and_later_ones_move(make_trainer):
    trainer = make_trainer()
    trainer.step()  # move the policy off the reference, so the test is not about LoRA's zero init
    trainer.step()
    stats = trainer.last_update_stats
    assert len(stats) == 2 * 2  # epochs x minibatches
    first = stats[0]
    assert first["epoch"] == 0 and first["minibatch"] == 0
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert first["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert first["clipfrac"] == 0.0
    assert first["approx_kl"] == pytest.approx(0.0, abs=1e-9)
    # after an optimiser step the policy has moved: the last minibatch sees ratio != 1
    assert abs(stats[-1]["ratio_mean"] - 1.0) > 1e-6 or stats[-1]["ratio_max"] > 1.0 + 1e-4


def test_an_update_lowers_the_clip_loss_on_its_batch(make_trainer):
    trainer = make_trainer(ppo_epochs=4, rollout_batch_size=8, mini_batch_size=8)
    trainer.step()
    batch = trainer.last_batch
    seq, attn, P = batch.sequences, batch.attention_mask, batch.context_length

    def clip_loss() -> float:
        with torch.no_grad():
            logp = trainer.model.policy_logprobs(seq, attn, P)
        loss, _ = policy_loss(logp, batch.old_logprobs, batch.advantages, batch.mask, clip_eps=0.2)
        return float(loss)

    # at the sampling policy the ratio is 1, so the loss is -mean(A) (0 for whitened advantages)
    before = -float((batch.advantages * batch.mask).sum() / batch.mask.sum())
    after = clip_loss()
    assert after < before - 1e-3
    # and it cannot fall below the clipped bound: -mean(min(r A, clip(r) A)) >= -mean(1.2 |A|)
    bound = -1.2 * float((batch.advantages.abs() * batch.mask).sum() / batch.mask.sum())
    assert after >= bound - 1e-6


def test_nan_reward_stops_the_run_and_keeps_the_last_good_checkpoint(make_trainer, tmp_path):
    calls = {"n": 0}

    def reward_then_nan(prompts, responses):
        calls["n"] += 1
        scores = good_count(prompts, responses)
        if calls["n"] == 3:  # the third step's rollouts
            scores[1] = math.nan
        return scores

    trainer = make_trainer(reward_fn=reward_then_nan, save_every=1, output_dir=str(tmp_path))
    saved = {}
    trainer_params = trainer.model.policy_parameters()
    with pytest.raises(NonFiniteError) as info:
        trainer.train(steps=5, callback=lambda m: saved.setdefault(int(m["step"]),
                                                                   snapshot(trainer_params)))
    message = str(info.value)
    assert "reward scores has 1 NaN/inf value(s) at PPO step 2" in message
    assert "step-000002" in message  # it names the last good checkpoint
    assert trainer.step_count == 2 and len(trainer.history) == 2
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-000002"
    # a fresh trainer restored from disk has exactly the weights after step 2
    fresh = make_trainer(seed=123)
    load_checkpoint(fresh, tmp_path)
    assert fresh.step_count == 2
    for a, b in zip(saved[2], fresh.model.policy_parameters(), strict=True):
        assert torch.equal(a, b.detach())


def test_non_finite_update_inputs_raise_before_any_weight_changes(make_trainer):
    trainer = make_trainer()
    trainer.step()
    batch = trainer.last_batch
    batch.advantages[0, 0] = math.nan
    before = snapshot(trainer.model.policy_parameters())
    # the loss checks its inputs (a batch made elsewhere: collect_experience checks its own
    # advantages)
    with pytest.raises(NonFiniteError, match="advantages must be finite.* at PPO step 1"):
        trainer.update(batch, torch.Generator().manual_seed(0))
    assert not changed(before, trainer.model.policy_parameters())
    # a weight gone non-finite: the policy's log-probs are caught before any optimiser step
    batch.advantages[0, 0] = 0.0
    value_before = snapshot(trainer.model.value_parameters())
    with torch.no_grad():
        trainer.model.policy_parameters()[0][0, 0] = math.inf
    with pytest.raises(NonFiniteError, match="logits must be finite.* at PPO step 1"):
        trainer.update(batch, torch.Generator().manual_seed(0))
    assert not changed(value_before, trainer.model.value_parameters())


def test_same_seed_same_curve_other_seed_other_curve(make_trainer):
    first = make_trainer(seed=3)
    first.train(steps=3)
    torch.manual_seed(999)  # the caller's RNG must not matter
    torch.rand(17)
    second = make_trainer(seed=3)
    second.train(steps=3)
    assert without_times(first.history) == without_times(second.history)
    other = make_trainer(seed=4)
    other.train(steps=3)
    assert without_times(other.history) != without_times(first.history)


def test_adaptive_kl_controller_moves_beta_and_the_next_rewards_use_it(make_trainer):
    trainer = make_trainer(kl_coef=0.2, target_kl=0.01, kl_horizon=100)
    assert isinstance(trainer.kl_controller, AdaptiveKLController)
    trainer.step()
    metrics = trainer.step()  # the policy has moved: KL > 0
    kl, beta_used = metrics["kl"], metrics["kl_coef"]
    # beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * B / horizon)
    expected = beta_used * (1 + min(max(kl / 0.01 - 1, -0.2), 0.2) * 8 / 100)
    assert trainer.kl_controller.value == pytest.approx(expected, rel=1e-9)
    assert trainer.kl_controller.value != beta_used
    # the next rollout shapes its rewards with the new beta
    trainer.step()
    batch = trainer.last_batch
    rewards, _ = shape_rewards(batch.scores, batch.old_logprobs, batch.ref_logprobs,
                               batch.mask, expected)
    assert torch.allclose(batch.rewards, rewards, atol=1e-6)
    assert trainer.history[-1]["kl_coef"] == pytest.approx(expected)

    fixed = make_trainer(kl_coef=0.2)
    assert isinstance(fixed.kl_controller, FixedKLController)
    fixed.train(steps=2)
    assert [m["kl_coef"] for m in fixed.history] == [0.2, 0.2]


def test_ptx_loss_is_used_when_its_coefficient_is_positive(make_trainer):
    texts = ["the movie is good .", "the plot was great .", "the acting is fine ."]
    plain = make_trainer()
    plain.step()
    with_ptx = make_trainer(ptx_coef=1.0, ptx_texts=texts)
    metrics = with_ptx.step()
    assert "ptx_loss" not in plain.history[0]
    assert math.isfinite(metrics["ptx_loss"]) and metrics["ptx_loss"] > 0
    # the rollouts are identical (same seed, same initial policy); only the update differs
    assert metrics["score"] == plain.history[0]["score"]
    diffs = [float((a.detach() - b.detach()).abs().max()) for a, b in
             zip(plain.model.policy_parameters(), with_ptx.model.policy_parameters(), strict=True)]
    assert max(diffs) > 1e-4
    with pytest.raises(ValueError, match="ptx_texts"):
        make_trainer(ptx_coef=0.5)


def test_value_warmup_trains_only_the_critic_first(make_trainer):
    trainer = make_trainer(value_warmup_steps=1)
    policy_before = snapshot(trainer.model.policy_parameters())
    value_before = snapshot(trainer.model.value_parameters())
    trainer.step()
    assert not changed(policy_before, trainer.model.policy_parameters())
    assert changed(value_before, trainer.model.value_parameters())
    trainer.step()
    assert changed(policy_before, trainer.model.policy_parameters())


def test_train_evaluates_and_reports_every_metric(make_trainer):
    trainer = make_trainer(eval_every=2, n_eval_prompts=4)
    seen = []
    history = trainer.train(steps=2, eval_prompts=PROMPTS, callback=seen.append)
    assert len(history) == 2 and seen == history
    for key in ("score", "hidden_score", "kl", "entropy", "clipfrac", "approx_kl", "value_loss",
                "explained_variance", "response_length", "kl_coef", "time_step"):
        assert all(math.isfinite(m[key]) for m in history), key
    assert "eval_hidden_score" in history[1] and "eval_hidden_score" not in history[0]
    # hidden_score is the hidden scorer on the rollouts (here: the toy reward itself)
    assert history[0]["hidden_score"] == pytest.approx(history[0]["score"])
    # evaluation is seeded and leaves the caller's RNG alone
    state = torch.random.get_rng_state()
    a, b = trainer.evaluate(PROMPTS), trainer.evaluate(PROMPTS)
    assert a == b and torch.equal(torch.random.get_rng_state(), state)


def test_evaluate_kl_is_zero_before_training(make_trainer):
    trainer = make_trainer()
    result = trainer.evaluate(PROMPTS)
    # LoRA starts at B = 0: policy == reference
    assert result["eval_kl"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("field", "value"), [
    ("rollout_batch_size", 0), ("mini_batch_size", -1), ("ppo_epochs", 0), ("max_new_tokens", 0),
    ("clip_eps", 0.0), ("policy_lr", math.nan), ("value_lr", -1e-3), ("max_grad_norm", math.inf),
    ("kl_coef", -0.1), ("entropy_coef", math.nan), ("ptx_coef", -1.0), ("gamma", 1.5),
    ("lam", -0.1), ("value_clip", 0.0), ("target_kl", -1.0), ("kl_kind", "k4"),
    ("temperature", 0.0),
    ("save_every", -1), ("value_warmup_steps", -2), ("seed", -1), ("seed", 2**63), ("seed", 1.5),
])
def test_bad_config_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        PPOConfig(**{field: value})


def test_config_batch_divisibility_and_unknown_fields():
    with pytest.raises(ValueError, match="rollout_batch_size .* multiple of mini_batch_size"):
        PPOConfig(rollout_batch_size=10, mini_batch_size=4)
    with pytest.raises(ValueError, match="unknown PPOConfig field"):
        PPOConfig().replace(learning_rate=1e-3)
    # whitening one response of one token divides by a variance of nothing
    with pytest.raises(ValueError, match="rollout_batch_size must be >= 2 when whiten_advantages"):
        PPOConfig(rollout_batch_size=1, mini_batch_size=1, max_new_tokens=1)
    PPOConfig(rollout_batch_size=1, mini_batch_size=1, max_new_tokens=1, whiten_advantages=False)
    PPOConfig(seed=2**32 - 1)  # the largest seed whose per-step seeds fit torch's generator
    config = PPOConfig(kl_coef=0.1, lora={"target_modules": ["c_attn"]})
    assert PPOConfig.from_dict(config.to_dict()) == config


def test_trainer_rejects_bad_arguments(make_trainer):
    trainer = make_trainer()
    with pytest.raises(ValueError, match="config must be a PPOConfig"):
        PPOTrainer({"kl_coef": 0.1}, trainer.model, trainer.tokenizer, PROMPTS)
    with pytest.raises(ValueError, match="prompts must be a non-empty list"):
        PPOTrainer(trainer.config, trainer.model, trainer.tokenizer, [])
    with pytest.raises(ValueError, match="prompts must be a non-empty list"):
        trainer.evaluate([])



def test_tempered_sampling_ratio_is_one_before_an_update_and_kl_starts_at_zero(make_trainer):
    """temperature 0.7: the ratio compares the distribution that sampled with itself before the
    first optimiser step, and the k1 KL of the untrained policy (LoRA B = 0: policy == reference) is
    0."""
    trainer = make_trainer(temperature=0.7)
    metrics = trainer.step()
    # same weights and the same tempered log-softmax in the sampling loop, the update and the
    # reference pass: only float rounding differs (log-probs < 30 in size, float32: < 1e-5)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-5)
    trainer.step()  # the policy has moved: check the ratio of a policy that is not the reference
    first = trainer.last_update_stats[0]
    assert first["epoch"] == 0 and first["minibatch"] == 0
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert first["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert first["clipfrac"] == 0.0


def test_evaluate_scores_every_prompt_in_batches_of_eval_batch_size(make_trainer, monkeypatch):
    """The gpu profile's 200 eval prompts in one pass would hold 200 x 48 x 49153 float logits:
    every forward of `evaluate` must see at most config.eval_batch_size rows, and every prompt is
    scored."""
    trainer = make_trainer(eval_batch_size=3)
    prompts = PROMPTS + PROMPTS[:2]  # 10 prompts: batches of 3, 3, 3 and 1
    rows: dict[str, list[int]] = {"policy_logprobs": [], "ref_logprobs": [], "reward": []}
    for name in ("policy_logprobs", "ref_logprobs"):
        original = getattr(trainer.model, name)

        def counted(sequences, *args, _original=original, _rows=rows[name], **kwargs):
            _rows.append(sequences.shape[0])  # (b, P + R): b rows in this forward
            return _original(sequences, *args, **kwargs)

        monkeypatch.setattr(trainer.model, name, counted)
    reward_fn = trainer.reward_fn

    def counted_reward(batch_prompts, responses):
        rows["reward"].append(len(batch_prompts))
        return reward_fn(batch_prompts, responses)

    trainer.reward_fn = counted_reward
    result = trainer.evaluate(prompts)
    for name, sizes in rows.items():
        assert sizes and max(sizes) <= 3, (name, sizes)
        assert sum(sizes) == len(prompts), (name, sizes)
    assert all(math.isfinite(value) for value in result.values())
    for sizes in rows.values():
        sizes.clear()
    trainer.evaluate(prompts, batch_size=4)  # an explicit batch size wins over the config's
    assert all(max(sizes) == 4 and sum(sizes) == len(prompts) for sizes in rows.values()), rows
    with pytest.raises(ValueError, match="batch_size"):
        trainer.evaluate(prompts, batch_size=0)


def test_eval_batch_size_comes_from_the_profile_and_must_be_positive():
    from rlhf_helpers.runtime.profiles import get_profile

    for name in ("tiny", "gpu"):
        profile = get_profile(name)
        assert profile.ppo.eval_batch_size == profile.ppo.eval_batch_size
    with pytest.raises(ValueError, match="eval_batch_size"):
        PPOConfig(eval_batch_size=0)


def test_ptx_loss_reads_no_padding_position_and_is_the_same_packed_or_not(make_trainer):
    """The ptx texts are left-padded: a row's first token has only a pad before it, so it is not a
    target (its logit would be read at a padding position, which the packed forward leaves at 0).
    The loss is then the mean next-token loss over the tokens whose previous token is real, the same
    on both forwards."""
    texts = ["the movie is good .", "the plot", "great"]
    losses = []
    for packed in (False, True):
        trainer = make_trainer(ptx_coef=1.0, ptx_texts=texts, mini_batch_size=4)
        trainer.model.packed = packed
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(1)
        losses.append(float(trainer.ptx_loss(generator)))
        picks = torch.randint(len(texts), (4,), generator=torch.Generator().manual_seed(1)).tolist()
    enc = trainer.tokenizer([texts[i] for i in picks], return_tensors="pt", padding=True,
                            padding_side="left")
    ids, attn = enc["input_ids"], enc["attention_mask"]
    trainer.model.packed = False
    with torch.no_grad():
        logits = trainer.model.policy_logits(ids, attn)[:, :-1]
        logp = torch.log_softmax(logits, dim=-1)  # (b, L - 1, V)
    target = (attn[:, 1:] * attn[:, :-1]).bool()  # a real token after a real token
    by_hand = -logp.gather(-1, ids[:, 1:, None])[..., 0][target].mean()
    assert losses[0] == pytest.approx(float(by_hand), rel=1e-5)
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
