"""A bad attempt at notebook 08's exercises cannot reach a later one (course.capstone_state): each
of these `make_experience`s does something to its model, its config, the model's classes or torch,
then fails; the worked solution run after it passes both checks. What every model shares (a class's
method, a torch function) is named in the check's message and put back, so the notebook's training
model never sees it."""

from __future__ import annotations

import pytest
import test_capstone
import torch
from test_capstone import LRS, PROMPTS, SEEDS
from torch import nn

from rlhf_helpers.course import capstone
from rlhf_helpers.course.capstone_reference import plain_experience, plain_iteration
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel

#: the toy model whose policy has moved from the reference, and the library's two runs
world = test_capstone.world


def _first_lora_layer(model):
    return next(m for m in model.lm.modules() if hasattr(m, "lora_A"))


#: name -> what the bad attempt does to its model and config before it fails
MISCHIEF = {
    "classpatch": lambda model, samples, config: setattr(
        type(model), "values", lambda self, *a, **k: torch.zeros(a[0].shape[0], 1)),
    "submodule_method": lambda model, samples, config: setattr(
        model.score_head, "forward", lambda h: torch.zeros(h.shape[:-1])),
    "hook": lambda model, samples, config: model.value_head.register_forward_hook(
        lambda module, inputs, output: output * 2),
    "eos": lambda model, samples, config: setattr(model, "eos_token_id",
                                                  model.eos_token_id + 1),
    "half": lambda model, samples, config: model.lm.half(),
    "adapter": lambda model, samples, config: (
        model.policy_logprobs(samples.sequences, samples.attention_mask, samples.context_length),
        model.peft.set_adapter("value")),
    "delattr": lambda model, samples, config: delattr(model, "score_head"),
    "newparam": lambda model, samples, config: setattr(
        _first_lora_layer(model).lora_A["policy"], "weight", nn.Parameter(torch.zeros(3, 3))),
    "torchpatch": lambda model, samples, config: setattr(
        torch, "randperm", lambda n, generator=None, **k: torch.arange(n)),
    "config": lambda model, samples, config: object.__setattr__(config, "kl_coef", 0.0),
}
#: what the check's message names for a change every model shares
NAMED = {"classpatch": "SharedLoRAModel.values", "torchpatch": "torch.randperm"}


@pytest.fixture
def shared_kept():
    """Whatever a failing test leaves patched, the next test finds the originals."""
    values, randperm = SharedLoRAModel.values, torch.randperm
    yield values, randperm
    SharedLoRAModel.values, torch.randperm = values, randperm


@pytest.mark.parametrize("case", sorted(MISCHIEF))
def test_the_worked_solution_passes_both_checks_after_a_bad_attempt(world, shared_kept, case):
    model, tok, runs = world
    config, expected = runs["free"]
    rtol = capstone.rounding_rtol(model, config)
    start = capstone.ModelSnapshot(model)

    def make_experience(model, samples, config):
        MISCHIEF[case](model, samples, config)
        raise ValueError("oops")

    with pytest.raises((ValueError, AssertionError)) as raised:
        capstone.run_experience(make_experience, model, tok, PROMPTS, config, SEEDS[0], start)
    if case in NAMED:
        assert str(raised.value).startswith(f"your make_experience patched {NAMED[case]}, which "
                                            "every model shares (the training model too)")
        assert "then it raised ValueError: oops" in str(raised.value)
    # the shared namespaces are the originals again: the training model does not see the patch
    assert (SharedLoRAModel.values, torch.randperm) == shared_kept
    rollout = capstone.run_experience(plain_experience, model, tok, PROMPTS, config, SEEDS[0],
                                      start)
    assert capstone.experience_difference(rollout, expected, rtol) is None
    got = capstone.run_iteration(plain_iteration, model, tok, PROMPTS, config, SEEDS, LRS, start)
    assert capstone.first_difference(got, expected, config, rtol) is None


def test_a_patch_that_passes_is_named_and_put_back_too(world, shared_kept):
    """A class patch in a function that returns normally is named as well: the check fails it."""
    model, tok, runs = world
    config, _ = runs["free"]

    def make_experience(model, samples, config):
        type(model).values = lambda self, *a, **k: None
        return plain_experience(model, samples, config)

    with pytest.raises(AssertionError, match=r"^your make_experience patched "
                                             r"SharedLoRAModel\.values, which every model shares"):
        capstone.run_experience(make_experience, model, tok, PROMPTS, config, SEEDS[0])
    assert SharedLoRAModel.values is shared_kept[0]


def test_a_patch_of_the_learners_own_is_not_blamed_on_an_attempt_nor_undone(world, shared_kept):
    """A patch made outside any check (the learner's own cell) is the caller's: the attempt runs
    without it and is not blamed for it, and the caller keeps it afterwards."""
    model, tok, runs = world
    config, expected = runs["free"]
    rtol = capstone.rounding_rtol(model, config)
    start = capstone.ModelSnapshot(model)  # the set-up cell

    def own_randperm(n, generator=None, **kwargs):
        return torch.arange(n)

    torch.randperm = own_randperm
    got = capstone.run_iteration(plain_iteration, model, tok, PROMPTS, config, SEEDS, LRS, start)
    assert torch.randperm is own_randperm
    torch.randperm = shared_kept[1]
    assert capstone.first_difference(got, expected, config, rtol) is None
