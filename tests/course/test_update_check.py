"""05 Exercise 4's hints (rlhf_helpers.course.update_check): the plain loop is the library's update,
and each plausible mistake is named by replaying it, on the toy world."""

from __future__ import annotations

import pytest
import torch
from conftest import TOY_PROMPTS, toy_trainer
from toy_world import good_count

from rlhf_helpers.course.update_check import explain_update_difference, loop_mistakes, update_loop
from rlhf_helpers.ppo.iteration import collect_experience

#: every setting the loop reads at a value of its own, as 05's check sets them
SETTINGS = dict(temperature=0.8, clip_eps=0.15, value_clip=0.05, vf_coef=0.4, kl_coef=0.1, lam=0.9,
                max_grad_norm=1e6)
POLICY_LR, VALUE_LR = 2.0, 0.05


@pytest.fixture(scope="module")
def world():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    trainer = toy_trainer(**SETTINGS)
    model, config = trainer.model, trainer.config
    with torch.no_grad():  # the policy moved away from the reference, as in the notebook's check
        g = torch.Generator().manual_seed(1)
        for param in model.policy_parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=g))
    batch = collect_experience(model, trainer.tokenizer, TOY_PROMPTS, config,
                               kl_coef=config.kl_coef, reward_fn=good_count)
    trainable = model.policy_parameters() + model.value_parameters()
    start = [p.detach().clone() for p in trainable]

    def run(cfg, changes=None, minibatches=None, library=False):
        with torch.no_grad():
            for param, weight in zip(trainable, start, strict=True):
                param.copy_(weight)
                param.grad = None
        policy_opt = torch.optim.SGD(model.policy_parameters(), lr=POLICY_LR)
        value_opt = torch.optim.SGD(model.value_parameters(), lr=VALUE_LR)
        if library:
            trainer.config = cfg
            trainer.policy_opt.optimizer, trainer.value_opt.optimizer = policy_opt, value_opt
            trainer.policy_opt.max_grad_norm = trainer.value_opt.max_grad_norm = cfg.max_grad_norm
            trainer.update(batch, torch.Generator().manual_seed(0))
            return torch.tensor(
                [(row["policy_loss"], row["value_loss"]) for row in trainer.last_update_stats])
        return torch.tensor(
            update_loop(model, batch, policy_opt, value_opt, cfg, torch.Generator().manual_seed(0),
                        clip_loss, minibatches=minibatches, **(changes or {})))

    return config, run


def clip_loss(logprobs, old_logprobs, advantages, mask, eps):
    rho = torch.exp(torch.where(mask.bool(), logprobs - old_logprobs, 0.0))  # (b, R)
    return -(torch.min(rho * advantages, rho.clamp(1 - eps, 1 + eps) * advantages)
             * mask).sum() / mask.sum()


def test_the_plain_loop_is_the_library_update_and_each_named_mistake_reproduces_itself(world):
    config, run = world
    expected = run(config, library=True)
    assert explain_update_difference(run(config), expected, config, lambda c,
                                     n: run(config, c, n)) is None
    named = 0
    for mistake in loop_mistakes(config):
        got = run(config, mistake.changes)
        hint = explain_update_difference(got, expected, config, lambda c, n: run(config, c, n))
        if hint is None:  # this setting cannot see it (e.g. a clip that never binds here)
            continue
        named += 1
        assert "Your numbers are those of a loop where" in hint, (mistake.cause, hint)
    assert named >= 10
    temperature = next(m for m in loop_mistakes(config) if m.changes == {"temperature": False})
    renormalised = next(m for m in loop_mistakes(config) if m.changes == {"renormalise": "all"})
    # the two the issue names: the hint is theirs, not another's
    for mistake in (temperature, renormalised):
        hint = explain_update_difference(run(config, mistake.changes), expected, config,
                                         lambda c, n: run(config, c, n))
        assert hint is not None and hint.endswith(mistake.cause), hint
