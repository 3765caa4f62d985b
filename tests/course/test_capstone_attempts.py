"""Notebook 08's checks start every attempt from the same state (course.capstone_state): a bad
attempt, or a correct one run after another, cannot change how a later attempt is judged; a weight
that a learner's function should only read is named when it changes, then put back."""

from __future__ import annotations

import random

import numpy as np
import pytest
import test_capstone
import torch
from test_capstone import LRS, PROMPTS, SEEDS

from rlhf_helpers.course import capstone
from rlhf_helpers.course.capstone_reference import _losses, plain_experience, plain_iteration
from rlhf_helpers.ppo.model.samples import sample_responses

#: the toy model whose policy has moved from the reference, and the library's two runs
world = test_capstone.world


@pytest.fixture(autouse=True)
def global_state_back():
    """Whatever a test's attempt leaves, the next test starts with autograd on and float32."""
    yield
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)


def step_then_zero_grad(model, tokenizer, prompts, policy_opt, value_opt, config, generator):
    """The worked solution's iteration with the other correct order of the update: backward, clip,
    step, then zero_grad (the gradients cleared after each step instead of before each backward)."""
    samples = sample_responses(model, tokenizer, prompts, config.max_prompt_length,
                               config.max_new_tokens, temperature=config.temperature)
    batch, losses = plain_experience(model, samples, config), []
    for _ in range(config.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for first in range(0, len(batch), config.mini_batch_size):
            rows = order[first : first + config.mini_batch_size]
            pg_loss, v_loss, _ = _losses(model, batch, rows, config, None)
            (pg_loss + config.vf_coef * v_loss).backward()
            torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)
            torch.nn.utils.clip_grad_norm_(model.value_parameters(), config.max_grad_norm)
            policy_opt.step()
            value_opt.step()
            policy_opt.zero_grad()
            value_opt.zero_grad()
            losses.append((pg_loss.item(), v_loss.item()))
    return batch, losses


def leaves_a_mess(model, tokenizer, prompts, policy_opt, value_opt, config, generator):
    """A bad attempt: gradients on every parameter, autograd off, float64 by default, the random
    generators moved, then an error."""
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    random.random(), np.random.rand(), torch.rand(1)
    torch.set_grad_enabled(False)
    torch.set_default_dtype(torch.float64)
    raise RuntimeError("the learner's loop stopped half-way")


def test_a_correct_loop_passes_whatever_attempt_ran_before_it(world):
    """The issue's case: 'backward, step, zero_grad' after the worked solution, and after an attempt
    that left gradients, autograd off and float64 behind, is judged as in a fresh kernel; the mess
    is named, and the notebook's state after the checks is the one before them."""
    model, tok, runs = world
    config, expected = runs["free"]
    rtol = capstone.rounding_rtol(model, config)
    python_state, numpy_state = random.getstate(), np.random.get_state()[1].copy()

    def check(iteration):
        got = capstone.run_iteration(iteration, model, tok, PROMPTS, config, SEEDS, LRS)
        return capstone.first_difference(got, expected, config, rtol)

    assert check(step_then_zero_grad) is None  # as in a fresh kernel
    assert check(plain_iteration) is None  # the worked solution
    assert check(step_then_zero_grad) is None
    with pytest.raises((AssertionError, RuntimeError)) as raised:
        check(leaves_a_mess)
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
    assert all(param.grad is None for param in model.parameters())
    assert random.getstate() == python_state
    assert (np.random.get_state()[1] == numpy_state).all()
    assert check(step_then_zero_grad) is None
    assert check(plain_iteration) is None
    assert str(raised.value).startswith(
        "leaves_a_mess left autograd off (torch.set_grad_enabled(False)) and the default dtype "
        "float64 (torch.set_default_dtype) for the code after it (put back now)")


def test_every_attempt_draws_the_same_random_numbers_and_gives_the_callers_back(world):
    """Python's and NumPy's generators are seeded for each attempt as torch's is: an iteration that
    draws from them draws the same numbers every time, and the notebook's own draws are kept."""
    model, tok, runs = world
    config, _ = runs["free"]
    draws = []

    def draws_too(*args):
        draws.append((random.random(), float(np.random.rand())))
        return plain_iteration(*args)

    random.seed(11)
    np.random.seed(11)
    python_state, numpy_state = random.getstate(), np.random.get_state()[1].copy()
    for _ in range(2):
        capstone.run_iteration(draws_too, model, tok, PROMPTS, config, SEEDS, LRS)
        random.random(), np.random.rand()  # the notebook draws between two attempts
    assert draws[0] == draws[1]
    random.seed(11)
    np.random.seed(11)
    assert random.getstate() == python_state and (np.random.get_state()[1] == numpy_state).all()
    capstone.run_iteration(draws_too, model, tok, PROMPTS, config, SEEDS, LRS)
    assert random.getstate() == python_state and (np.random.get_state()[1] == numpy_state).all()


def scales_a_weight(model, samples, config):
    """A bad Exercise 1: the experience is right, but the policy and the base weights are scaled in
    place on the way."""
    out = plain_experience(model, samples, config)
    with torch.no_grad():
        model.policy_parameters()[0].mul_(1.5)
        model.lm.get_input_embeddings().weight.mul_(1.5)
    return out


def test_a_make_experience_that_changes_a_weight_is_named_and_no_later_attempt_sees_it(world):
    """One bad Exercise 1 attempt used to break every later check, the worked solution included:
    now it fails with the weights named, and each attempt starts from the set-up's snapshot."""
    model, tok, runs = world
    config, expected = runs["free"]
    rtol = capstone.rounding_rtol(model, config)
    start = capstone.ModelSnapshot(model)
    with pytest.raises(AssertionError, match=(
            r"^your scales_a_weight changed the model's weights \(the base model, the policy "
            r"adapter\): it should only read them")):
        capstone.run_experience(scales_a_weight, model, tok, PROMPTS, config, SEEDS[0], start)
    rollout = capstone.run_experience(plain_experience, model, tok, PROMPTS, config, SEEDS[0],
                                      start)
    assert capstone.experience_difference(rollout, expected, rtol) is None
    got = capstone.run_iteration(plain_iteration, model, tok, PROMPTS, config, SEEDS, LRS, start)
    assert capstone.first_difference(got, expected, config, rtol) is None
    # a change made outside any check (the learner's own cell) is undone by the next attempt too
    with torch.no_grad():
        model.value_parameters()[0].add_(1.0)
    got = capstone.run_iteration(plain_iteration, model, tok, PROMPTS, config, SEEDS, LRS, start)
    assert capstone.first_difference(got, expected, config, rtol) is None


def test_an_iteration_may_train_the_two_adapters_and_nothing_else(world):
    model, tok, runs = world
    config, _ = runs["free"]
    reward_head = model.score_head.linear.weight.detach().clone()

    def trains_the_reward_head(*args):
        with torch.no_grad():
            args[0].score_head.linear.weight.add_(1.0)  # the model the attempt runs on
        return plain_iteration(*args)

    with pytest.raises(AssertionError, match=(
            r"^your trains_the_reward_head changed weights that do not train \(the reward "
            r"head\): only the policy and value adapters")):
        capstone.run_iteration(trains_the_reward_head, model, tok, PROMPTS, config, SEEDS, LRS)
    assert torch.equal(model.score_head.linear.weight.detach(), reward_head)


def test_a_method_patched_by_an_attempt_is_the_models_own_again(world):
    model, tok, runs = world
    config, expected = runs["free"]

    def patches_the_model(model, *args):
        model.policy_logprobs = lambda *a, **k: None  # a debugging patch, never taken off
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        capstone.run_iteration(patches_the_model, model, tok, PROMPTS, config, SEEDS, LRS)
    assert "policy_logprobs" not in vars(model)
