"""Notebook 07's comparison machinery: TRL's GRPO and RLOO trainers agree with the course's group
advantages, the reward function scores what PPO's reward scores, the judge sees TRL's policy, DPO's
implicit reward is the one TRL's DPOTrainer trains, the win rate counts what it says, and the budget
and schedule do what they say.

The TRL runs use a fresh (untrained) reward adapter: its scores are noise, but every check here is
about which numbers the trainers compute from them, not about learning.
"""

from __future__ import annotations

import time

import pytest
import torch

from rlhf_helpers.compare import CompareConfig, run_method
from rlhf_helpers.compare.clock import TrainingClock
from rlhf_helpers.compare.learned_reward import LearnedRewardFunction
from rlhf_helpers.compare.result import EvalSchedule, win_rate
from rlhf_helpers.core.group_advantages import group_rewards, grpo_advantages, rloo_advantages
from rlhf_helpers.ppo.model.build import build_shared_model
from rlhf_helpers.ppo.model.samples import sample_responses, score_samples
from rlhf_helpers.runtime.data import load_preferences, load_prompts
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.profiles import get_profile

#: float32 advantages: (r - mean) / (std + eps) of rewards of size ~1-3 computed by TRL and by us in
#: a different order; each result carries a few float32 roundings (2^-24 ~ 6e-8 relative) of values
#: up to |A| ~ G / sqrt(G - 1) < 3, so 1e-5 absolute is two orders above the rounding on any CPU.
ADVANTAGE_ATOL = 1e-5


@pytest.fixture(scope="module")
def profile():
    return get_profile("tiny")


def small_config(profile, **changes) -> CompareConfig:
    """Two batches of 16 responses (a budget in batches: however fast the CPU)."""
    values = {"train_batches": 2, "eval_points": 1, "early_evals": 0, "n_eval_prompts": 8,
              "samples_per_batch": 16}
    values.update(changes)
    return CompareConfig.from_profile(profile, **values)


@pytest.fixture(scope="module")
def grpo_run(profile):
    return run_method("grpo", small_config(profile), profile, None, load_prompts("test"),
                      progress_bar=False)


def test_config_refuses_bad_settings(profile):
    with pytest.raises(ValueError, match="group_size"):
        CompareConfig(group_size=1)
    with pytest.raises(ValueError, match="multiple of group_size"):
        CompareConfig(samples_per_batch=30)
    with pytest.raises(ValueError, match="grpo_loss_type"):
        CompareConfig(grpo_loss_type="sum")
    with pytest.raises(ValueError, match="train_seconds"):
        CompareConfig(train_seconds=0)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="train_batches must be None or an int >= 1"):
            CompareConfig(train_batches=bad)
    with pytest.raises(ValueError, match="method must be one of"):
        run_method("kto", small_config(profile), profile, None, ["a prompt"])


def test_from_profile_takes_the_profile_settings(profile):
    config = CompareConfig.from_profile(profile)
    assert config.train_seconds == profile.compare_seconds
    # tiny: reproducible
    assert config.train_batches == profile.compare_batches and config.budget_unit == "batches"
    assert CompareConfig.from_profile(profile, train_batches=None).budget_unit == "seconds"
    assert config.samples_per_batch == profile.ppo.rollout_batch_size
    assert (config.kl_coef, config.learning_rate) == (profile.ppo.kl_coef, profile.ppo.policy_lr)
    assert config.prompts_per_batch * config.group_size == config.samples_per_batch


def test_eval_schedule_fires_once_per_mark():
    schedule = EvalSchedule(budget=10.0, points=4)  # seconds: marks 2.5, 5, 7.5, 10
    # batches do not count
    fired = [schedule.due(t, batches=99) for t in (1.0, 2.6, 3.0, 8.0, 9.0, 10.0)]
    assert fired == [False, True, False, True, False, True]  # 8.0 passes two marks: one evaluation
    assert schedule.done(10.0) and not schedule.done(9.99, batches=10**6)
    # marks 1, 2 (1/4 and 1/2 of the first), 4, 8
    early = EvalSchedule(budget=8.0, points=2, early=2)
    assert early.marks == [1.0, 2.0, 4.0, 8.0]
    in_batches = EvalSchedule.for_config(
        CompareConfig(train_batches=32, eval_points=4, early_evals=2))
    assert in_batches.unit == "batches" and in_batches.marks == [2.0, 4.0, 8.0, 16.0, 24.0, 32.0]
    fired = [in_batches.due(1e9, batches=b) for b in (1, 2, 3, 9, 24)]  # seconds do not count
    assert fired == [False, True, False, True, True]  # batch 9 passes marks 4 and 8: one evaluation
    assert in_batches.done(0.0, batches=32) and not in_batches.done(1e9, batches=31)
    with pytest.raises(ValueError, match="unit must be 'seconds' or 'batches'"):
        EvalSchedule(budget=1.0, points=1, unit="steps")


def test_clock_counts_only_inside_running():
    clock = TrainingClock("cpu")
    with clock.running():
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    spent = clock.seconds
    end = time.process_time() + 0.05
    while time.process_time() < end:  # outside: not counted
        pass
    assert 0.05 <= spent < 0.5 and clock.seconds == spent and clock.kind == "cpu"


def test_reward_function_scores_what_ppo_scores(profile):
    torch.manual_seed(0)
    model, tokenizer = build_shared_model(profile, profile.ppo, None)
    prompts = load_prompts("test")[:12]
    samples = sample_responses(model, tokenizer, prompts, profile.ppo.max_prompt_length,
                               profile.ppo.max_new_tokens)
    expected = score_samples(model, samples)  # PPO's scores: (B,)
    P = samples.context_length
    completion_ids = [row[P:][mask.bool()].tolist() for row,
                      mask in zip(samples.sequences, samples.mask, strict=True)]
    reward_fn = LearnedRewardFunction(model, tokenizer, profile.ppo.max_prompt_length)
    scores = reward_fn(prompts=prompts, completions=samples.responses,
                       completion_ids=completion_ids)
    # same ids, same mask up to the EOS: only the padded width may differ, which a causal model
    # ignores
    torch.testing.assert_close(torch.tensor(scores), expected, atol=1e-5, rtol=1e-5)
    assert reward_fn.samples_scored == 12
    with pytest.raises(ValueError, match="one entry per completion"):
        reward_fn.score(prompts[:2], completion_ids[:1])
    vocab = len(tokenizer)
    for bad_id in (vocab, -1):  # an IndexError deep in the embedding before
        with pytest.raises(ValueError, match=rf"completion_ids\[1\] holds the token id {bad_id}, "
                                             rf"outside the model's vocabulary \[0, {vocab}\)"):
            reward_fn.score(prompts[:2], [completion_ids[0], [3, bad_id]])
    with pytest.raises(ValueError,
                       match=r"completion_ids\[0\] must hold integer token ids, got torch.float32"):
        reward_fn.score(prompts[:1], [[1.5]])
    assert reward_fn.samples_scored == 12  # nothing scored by the refused calls


def test_grpo_trainer_advantages_equal_grpo_advantages(grpo_run):
    assert grpo_run.advantages and len(grpo_run.advantages) == len(grpo_run.rewards)
    for rewards, advantages in zip(grpo_run.rewards, grpo_run.advantages, strict=True):
        expected = grpo_advantages(group_rewards(rewards, 4), scale="group").flatten()  # (N * G,)
        torch.testing.assert_close(advantages, expected, atol=ADVANTAGE_ATOL, rtol=0)


def test_run_stops_after_train_batches_and_evaluates_at_the_end(grpo_run):
    assert len(grpo_run.rewards) == 2 and grpo_run.final["step"] == 2 * 4  # 2 batches x 4 updates
    seconds = [row["train_seconds"] for row in grpo_run.curve]
    assert seconds[0] == 0.0 and seconds[-1] > 0.0
    assert len(grpo_run.curve) == 2  # before training, then once at the end (eval_points=1)
    samples = [row["samples"] for row in grpo_run.curve]
    assert samples[-1] == 16 * len(grpo_run.rewards)  # every generation batch holds 16 responses
    assert grpo_run.trainable_parameters > 0 and grpo_run.clock == "cpu"


def test_every_method_starts_from_the_same_judged_point(profile, grpo_run):
    ppo = run_method("ppo", small_config(profile, train_batches=1), profile, None,
                     load_prompts("test"), progress_bar=False)
    assert ppo.final["step"] == 1 and ppo.final["samples"] == 16
    # before training every policy adapter is LoRA's B = 0, i.e. the SFT model: same seed, same
    # samples
    for key in ("eval_hidden_score", "eval_score", "eval_response_length"):
        assert ppo.curve[0][key] == pytest.approx(grpo_run.curve[0][key], abs=1e-5)
    assert abs(ppo.curve[0]["eval_kl"]) < 1e-5


#: what a run judges and counts; train_seconds and wall_seconds are the machine's timings, not the
#: run's
REPRODUCED = ("step", "samples", "eval_hidden_score", "eval_score", "eval_kl",
              "eval_response_length")


@pytest.mark.parametrize("method", ["ppo", "grpo"])
def test_a_budget_in_batches_reproduces_for_its_seed(profile, method):
    """Notebook 07's promise: the same seed gives the same numbers, whatever the CPU time of each
    step. One process, one thread count, the same seed: every operation repeats bit for bit, so
    exact equality."""
    config = small_config(profile, eval_points=2)  # marks at batch 1 and 2: three evaluations
    runs = [run_method(method, config, profile, None, load_prompts("test"), progress_bar=False)
            for _ in range(2)]
    first, second = ([{k: row[k] for k in REPRODUCED} for row in run.curve] for run in runs)
    assert len(first) == 3 and first == second
    # trained: the policy left the SFT model
    assert first[-1]["samples"] == 2 * 16 and first[-1]["eval_kl"] > 0


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_rloo_trainer_advantages_equal_rloo_advantages(profile, kl_coef):
    run = run_method("rloo", small_config(profile, kl_coef=kl_coef), profile, None,
                     load_prompts("test"), progress_bar=False)
    assert len(run.advantages) == 2
    pairs = list(zip(run.rewards, run.advantages, strict=True))
    # with kl_coef > 0 RLOO subtracts beta * sequence KL from the reward; on the first batch the
    # policy is still the reference (LoRA B = 0), so that KL is exactly 0 there, and only there
    checked = pairs if kl_coef == 0.0 else pairs[:1]
    for rewards, advantages in checked:
        expected = rloo_advantages(group_rewards(rewards, 4)).flatten()
        torch.testing.assert_close(advantages, expected, atol=ADVANTAGE_ATOL, rtol=0)
    if kl_coef > 0:  # later batches carry the KL term: the test above would fail on them
        rewards, advantages = pairs[-1]
        assert (advantages
                - rloo_advantages(group_rewards(rewards, 4)).flatten()).abs().max() > ADVANTAGE_ATOL


def test_dr_grpo_settings_give_centred_rewards(profile):
    config = small_config(profile, grpo_loss_type="dr_grpo",
                          grpo_scale_rewards="none", train_batches=1)
    run = run_method("grpo", config, profile, None, load_prompts("test"), progress_bar=False)
    assert run.settings["loss_type"] == "dr_grpo" and run.settings["scale_rewards"] == "none"
    for rewards, advantages in zip(run.rewards, run.advantages, strict=True):
        grouped = group_rewards(rewards, 4)
        torch.testing.assert_close(advantages, (grouped - grouped.mean(1, keepdim=True)).flatten(),
                                   atol=ADVANTAGE_ATOL, rtol=0)


# peft reads transformers' old flag
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_judge_sees_the_policy_trl_trained(profile):
    from peft import get_peft_model

    from rlhf_helpers.compare.trl_methods import copy_policy_adapter
    from rlhf_helpers.ppo.model.adapters import lora_config, uses_conv1d
    from rlhf_helpers.runtime.models import load_causal_lm

    config = profile.ppo
    judge, tokenizer = build_shared_model(profile, config, None)
    base = load_causal_lm(profile)
    trl_like = get_peft_model(base, lora_config(config.lora.r, config.lora.alpha,
                                                config.lora.target_modules, uses_conv1d(base)))
    with torch.no_grad():  # a trained-looking adapter: B != 0
        for name, param in trl_like.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn_like(param) * 0.05)
    copy_policy_adapter(trl_like, judge)
    ids = tokenizer(["The movie was fine and the acting"], return_tensors="pt")["input_ids"]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = trl_like(input_ids=ids, attention_mask=mask).logits.float()
        got = judge.policy_logits(ids, mask).float()
    # peft's forward vs the judge's folded LoRA (W + sBA in one product): float32 rounding of sums
    # over 128-512 products, ~1e-6 relative on logits of size ~10; 1e-4 absolute is far above that
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert (got - judge.policy_logits(ids, mask)).abs().max() == 0  # deterministic


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("field", "value"), [
    ("samples_per_batch", 0), ("samples_per_batch", -16), ("lora", {"r": 0}),
    ("lora", {"alpha": -1}), ("max_prompt_length", 0), ("seed", -1), ("seed", 2**40),
    ("learning_rate", float("inf")), ("learning_rate", float("nan")), ("kl_coef", float("inf")),
    ("kl_coef", -0.1), ("train_seconds", float("inf")), ("lora", {"target_modules": ()}),
    ("lora", {"target_modules": "c_attn"}), ("lora", {"target_modules": ("c_attn", "")}),
])
def test_config_names_each_bad_value(field, value):
    with pytest.raises(ValueError, match=field):
        CompareConfig(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("train_seconds", "30"),
        ("lora", {"r": 8.0}),
        ("lora", "r=8"),
        ("seed", None),
        ("kl_coef", True),
        ("samples_per_batch", "64"),
    ],
)
def test_config_names_each_wrong_type(field, value):
    with pytest.raises(TypeError, match=field):
        CompareConfig(**{field: value})


def test_from_profile_and_run_method_refuse_a_missing_profile(profile):
    with pytest.raises(TypeError, match="profile must be a Profile"):
        CompareConfig.from_profile(None)
    with pytest.raises(TypeError, match="profile must be a Profile"):
        run_method("ppo", small_config(profile), None, None, ["a prompt"])


@pytest.mark.parametrize("method", ["grpo", "rloo"])
@pytest.mark.parametrize(("train_prompts", "match"), [
    ([], "train_prompts has 0 prompt"), (["a", "b", "c"], "at least 4 needed"),
    (["good prompt", 7, "x", "y"], r"train_prompts\[1\]"),
    (["ok", "  ", "x", "y"], r"train_prompts\[1\]"), ("the movie was", "list of prompt strings"),
])
def test_group_methods_refuse_too_few_or_bad_prompts_before_training(profile, method,
                                                                     train_prompts, match):
    """3 prompts where a batch needs 16 / 4 = 4 used to give a run holding only the step-0
    evaluation."""
    with pytest.raises(ValueError, match=match):
        run_method(method, small_config(profile), profile, None, ["a prompt"],
                   train_prompts=train_prompts, progress_bar=False)


def test_exactly_one_batch_of_prompts_trains(profile):
    """The lower bound is tight: prompts_per_batch prompts give a trained batch and a second
    evaluation."""
    config = small_config(profile, train_batches=1)
    prompts = load_prompts("train")[: config.prompts_per_batch]
    run = run_method("rloo", config, profile, None, load_prompts("test"), train_prompts=prompts,
                     progress_bar=False)
    assert len(run.curve) == 2 and run.curve[-1]["samples"] == config.samples_per_batch


def test_eval_prompts_must_be_strings(profile):
    with pytest.raises(ValueError, match=r"eval_prompts\[0\]"):
        run_method("ppo", small_config(profile), profile, None, [None])


def test_a_list_of_target_modules_is_stored_as_the_tuple():
    config = CompareConfig(lora={"target_modules": ["c_attn", "c_proj"]})
    assert config.lora.target_modules == ("c_attn",
                                          "c_proj") and hash(config) == hash(CompareConfig(
        lora=LoRASpec(target_modules=("c_attn", "c_proj"))))


def test_best_of_n_needs_two_eval_prompts_for_its_standard_error(profile):
    """One prompt used to report hidden_se = nan; now it is refused before any sampling."""
    from rlhf_helpers.compare import run_best_of_n

    with pytest.raises(ValueError,
                       match=r"has 1 prompt\(s\); at least 2 needed \(the standard error"):
        run_best_of_n(small_config(profile), profile, None, ["the movie was"])
    with pytest.raises(ValueError, match="at least 2 needed"):
        run_best_of_n(small_config(profile).replace(n_eval_prompts=1), profile, None, ["a", "b"])


def test_best_of_must_be_a_tuple_not_one_number():
    """best_of=5 was a TypeError ('int' object is not iterable) naming no field."""
    from rlhf_helpers.runtime.profiles import get_profile

    with pytest.raises(ValueError,
                       match=r"best_of must be a non-empty tuple of ints >= 1, got int 5"):
        CompareConfig.from_profile(get_profile("tiny"), best_of=5)


# ----------------------------------------------------------------------------- DPO and the win rate
def test_win_rate_counts_wins_and_half_ties():
    wins = win_rate([1.0, 2.0, 3.0, 0.0], [0.0, 2.0, 4.0, -1.0])
    assert wins == pytest.approx((1 + 0.5 + 0 + 1) / 4)  # win, tie, loss, win
    assert win_rate([0.3] * 5, [0.3] * 5) == 0.5  # a policy against itself
    with pytest.raises(ValueError, match="one score per prompt"):
        win_rate([1.0, 2.0], [1.0])


def test_each_evaluation_keeps_its_per_prompt_scores_and_win_rate(grpo_run):
    assert len(grpo_run.eval_hidden_scores) == len(grpo_run.curve)
    for row, scores in zip(grpo_run.curve, grpo_run.eval_hidden_scores, strict=True):
        assert len(scores) == 8 and sum(scores) / 8 == pytest.approx(row["eval_hidden_score"])
        # a loop, not win_rate: against the first evaluation (the SFT model), a tie one half
        wins = [1.0 if s > b else 0.5 if s == b else 0.0
                for s, b in zip(scores, grpo_run.eval_hidden_scores[0], strict=True)]
        assert row["eval_win_rate"] == pytest.approx(sum(wins) / 8)
    assert grpo_run.curve[0]["eval_win_rate"] == 0.5 and "hidden_scores" not in grpo_run.curve[0]


@pytest.fixture(scope="module")
def dpo_run(profile):
    return run_method("dpo", small_config(profile), profile, None, load_prompts("test"),
                      progress_bar=False)


def test_dpo_trains_its_budget_on_the_first_pairs_and_starts_from_the_sft_model(dpo_run, grpo_run):
    # 2 batches x 4 updates, each on 16 / 4 = 4 responses: 2 pairs a step, 16 pairs, one pass
    assert dpo_run.final["step"] == 8 and dpo_run.final["samples"] == 32
    assert dpo_run.settings["pairs"] == 16 and dpo_run.settings["per_device_train_batch_size"] == 2
    assert dpo_run.settings["beta"] == small_config(get_profile("tiny")).kl_coef
    assert dpo_run.trainable_parameters == grpo_run.trainable_parameters  # the same LoRA shape
    for key in ("eval_hidden_score", "eval_score", "eval_response_length"):  # the same judged start
        assert dpo_run.curve[0][key] == pytest.approx(grpo_run.curve[0][key], abs=1e-5)
    assert dpo_run.final["eval_kl"] != 0.0  # it moved
    assert dpo_run.policy_state  # and kept its adapter for the deep dive


# peft reads transformers' old flag
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_implicit_rewards_read_pairs_as_dpo_trainer_trains_on_them(profile):
    """DPO's loss from `implicit_rewards` (the judge's folded LoRA, our tokenisation) equals the
    loss TRL's DPOTrainer computes on the same pairs with the same adapter: the deep dive's implicit
    reward is the one DPO trained."""
    import tempfile

    import torch.nn.functional as F

    from rlhf_helpers.compare.dpo_method import dpo_arguments, dpo_trainer, implicit_rewards
    from rlhf_helpers.compare.trl_methods import copy_policy_adapter
    from rlhf_helpers.runtime.models import load_causal_lm

    config = small_config(profile)
    pairs = load_preferences("test")[:6]
    judge, tokenizer = build_shared_model(profile, profile.ppo, None)
    with tempfile.TemporaryDirectory() as output_dir:
        args = dpo_arguments(config, torch.device("cpu"), torch.float32, output_dir)
        trainer = dpo_trainer(args, config, load_causal_lm(profile), tokenizer, pairs)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: the policy differs from the reference
        for name, param in trainer.model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    trainer.model.eval()
    with torch.no_grad():
        trl_loss = trainer.compute_loss(trainer.model, batch)
    copy_policy_adapter(trainer.model, judge)
    scores = implicit_rewards(judge, tokenizer, pairs, config.kl_coef, config.max_prompt_length)
    margin = scores["implicit_chosen"] - scores["implicit_rejected"]  # (6,)
    assert margin.abs().max() > 0.1  # the adapter moved the policy: a loss far from log 2
    # peft's forward vs the judge's folded LoRA, summed over <= 30 tokens: float32 rounding ~1e-6
    torch.testing.assert_close(trl_loss, -F.logsigmoid(margin).mean(), atol=1e-4, rtol=0)


@pytest.mark.parametrize(("pairs", "match"), [
    ("pairs", "list of preference pairs"), ([{"prompt": "p", "chosen": "a"}], r"train_pairs\[0\]"),
    ([{"prompt": "p", "chosen": "a", "rejected": " "}], r"train_pairs\[0\]"),
    ([{"prompt": "p", "chosen": "a", "rejected": "b"}], "at least 2 needed"),
])
def test_dpo_refuses_bad_or_too_few_pairs_before_training(profile, pairs, match):
    with pytest.raises(ValueError, match=match):
        run_method("dpo", small_config(profile), profile, None, ["a prompt"], train_pairs=pairs,
                   progress_bar=False)
