"""Notebook 06's harness (`rlhf_helpers.course.failure_runs`) on the tiny profile: short real PPO
runs."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_helpers.course.failure_runs import (
    LabSizes,
    adapter_state,
    correlation,
    load_adapter_state,
    run_variant,
    seed_band,
    series,
    third_stats,
)
from rlhf_helpers.ppo.model.build import build_shared_model
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.profiles import get_profile

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: A very small lab: 4 prompts a step, 8 new tokens, one epoch of two minibatches.
SMALL = dict(rollout_batch_size=4, mini_batch_size=2, ppo_epochs=1, max_new_tokens=8)


@pytest.fixture(scope="module")
def lab():
    """(profile, config, model, tokenizer, prompts, start): the tiny model with a fresh reward
    adapter."""
    profile = get_profile("tiny")
    config = LabSizes.from_profile(profile).ppo_config(profile, **SMALL)
    # untrained reward: fine here
    model, tokenizer = build_shared_model(profile, config, reward_dir=None)
    return profile, config, model, tokenizer, load_prompts("train")[:32], adapter_state(model)


def test_lab_sizes_follow_the_profile():
    tiny = LabSizes.from_profile(get_profile("tiny"))
    assert (tiny.batch, tiny.mini_batch, tiny.epochs) == (16, 8, 2)
    assert tiny.long_steps == 30 and tiny.short_steps == 12 and tiny.warmup_steps == 4
    quick = LabSizes.from_profile(get_profile("tiny", total_steps=3, rollout_batch_size=4,
                                              mini_batch_size=2, ppo_epochs=1))
    assert quick.batch >= 2 and quick.epochs >= 1 and min(quick.long_steps, quick.short_steps) >= 2
    config = tiny.ppo_config(get_profile("tiny"), kl_coef=0.0)
    assert (config.rollout_batch_size, config.ppo_epochs, config.kl_coef) == (16, 2, 0.0)


def test_a_run_has_one_history_row_and_one_extras_row_per_step(lab):
    _, config, model, tokenizer, prompts, start = lab
    run = run_variant(PPOTrainer, config, model, tokenizer, prompts, 2, start=start,
                      extras=True, progress=False)
    assert [row["step"] for row in run.history] == [1.0, 2.0]
    assert len(run.extras) == 2
    assert all(abs(e["first_ratio_mean"] - 1.0) < 1e-4 for e in run.extras)  # old = sampling policy
    assert all(len(e["eos_advantage"]) == len(e["eos_change"]) for e in run.extras)
    assert series(run.history, "kl")[0] == [1.0, 2.0]
    no_extras = run_variant(PPOTrainer, config, model, tokenizer, prompts, 1,
                            start=start, progress=False)
    assert no_extras.extras == []


def test_every_run_starts_from_the_given_state(lab):
    _, config, model, tokenizer, prompts, start = lab
    first = run_variant(PPOTrainer, config, model, tokenizer, prompts, 1,
                        start=start, progress=False)
    moved = adapter_state(model)
    assert any(not torch.equal(a, b) for a,
               b in zip(moved, start, strict=True)), "the step trained nothing"
    again = run_variant(PPOTrainer, config, model, tokenizer, prompts, 1,
                        start=start, progress=False)
    for key in ("score", "kl", "response_length"):
        assert first.history[0][key] == pytest.approx(again.history[0][key], abs=1e-5), key
    load_adapter_state(model, start)
    assert all(torch.equal(a, b) for a, b in zip(adapter_state(model), start, strict=True))
    with pytest.raises(ValueError, match="tensors"):
        load_adapter_state(model, start[:-1])


def test_kl_coef_zero_removes_the_kl_term_from_the_rewards(lab):
    _, config, model, tokenizer, prompts, start = lab
    for kl_coef in (0.0, 0.5):
        run = run_variant(PPOTrainer, config.replace(kl_coef=kl_coef), model, tokenizer, prompts, 1,
                          start=start, progress=False)
        batch = run.trainer.last_batch
        expected = -kl_coef * batch.kl  # (B, R): the KL part; the score sits on the last real token
        last = batch.mask.sum(1).long() - 1  # (B,)
        expected[torch.arange(len(last)), last] += batch.scores
        torch.testing.assert_close(batch.rewards, expected)
    # one step from the start: the policy is off the reference
    assert float(batch.kl.abs().sum()) > 0


def test_value_warmup_variant_freezes_the_policy(lab):
    _, config, model, tokenizer, prompts, start = lab
    run_variant(PPOTrainer, config.replace(value_warmup_steps=1), model, tokenizer, prompts, 1,
                start=start, progress=False)
    n_policy = len(model.policy_parameters())
    after = adapter_state(model)
    assert all(torch.equal(a, b) for a, b in zip(after[:n_policy], start[:n_policy], strict=True))
    assert any(not torch.equal(a, b) for a,
               b in zip(after[n_policy:], start[n_policy:], strict=True))


def test_run_variant_refuses_zero_steps(lab):
    _, config, model, tokenizer, prompts, start = lab
    with pytest.raises(ValueError, match="steps"):
        run_variant(PPOTrainer, config, model, tokenizer, prompts, 0, start=start)


def test_seed_band_third_stats_and_correlation():
    runs = [[{"step": 1.0, "x": 1.0}, {"step": 2.0, "x": 4.0}],
            [{"step": 1.0, "x": 3.0}, {"step": 2.0, "x": 0.0}]]
    assert seed_band(runs, "x") == {"step": [1.0, 2.0], "mean": [2.0, 2.0], "low": [1.0, 0.0],
                                    "high": [3.0, 4.0]}
    with pytest.raises(ValueError):
        seed_band([runs[0], runs[0][:1]], "x")
    assert [m for m, _ in third_stats([1, 1, 1, 4, 4, 4, 7, 7, 7])] == [1, 4, 7]
    assert [se for _, se in third_stats([1, 1, 1, 4, 4, 4, 7, 7, 7])] == [0, 0, 0]
    # first third: [1, 3], sample std sqrt(2), over sqrt(2)
    (_, se), *_ = third_stats([1, 3, 5, 0, 0, 0])
    assert se == pytest.approx(1.0)
    assert math.isnan(third_stats([2.0, 4.0])[2][1])  # a third of one value has no spread
    assert correlation([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert math.isnan(correlation([1, 2], [3, 4]))
