"""PPOTrainer's replaceable maths (ppo/pieces.py): a user's shaping, advantages and losses drive real training."""

from __future__ import annotations

import pytest
import torch

from rlhf_helpers.core.gae import compute_gae
from rlhf_helpers.core.kl import shape_rewards
from rlhf_helpers.core.losses import policy_loss, value_loss


def numbers(history):
    """The metrics of each iteration that are numbers of the run, not of the clock."""
    return [{k: v for k, v in row.items() if not k.startswith("time")} for row in history]


def gae_loop(rewards, values, mask, gamma, lam):
    """A learner's GAE: the backward loop A_t = delta_t + gamma lam A_{t+1}, one row at a time."""
    advantages = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        last, next_value = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[i, t] == 0:
                continue
            delta = rewards[i, t] + gamma * next_value - values[i, t]
            last = delta + gamma * lam * last
            advantages[i, t] = last
            next_value = values[i, t]
    return advantages, (advantages + values) * mask


def clip_loss(logprobs, old_logprobs, advantages, mask, eps):
    """A learner's clipped loss, a bare scalar: -mean over real tokens of min(rho A, clip(rho) A)."""
    ratio = torch.exp(logprobs - old_logprobs)
    objective = torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - eps, 1 + eps) * advantages)
    return -(objective * mask).sum() / mask.sum()


def test_library_pieces_given_as_bare_functions_give_the_same_run_to_the_bit(make_trainer):
    """The default run, and the same maths passed in as bare-result functions: identical metrics and weights.
    The trainer then measures the stats with the library's loss on the same inputs, so nothing is lost."""
    default = make_trainer()
    passed = make_trainer(
        shape_rewards_fn=lambda *args: shape_rewards(*args)[0],  # rewards only: the trainer adds the k1 kl
        advantage_fn=lambda *args: compute_gae(*args),
        policy_loss_fn=lambda *args: policy_loss(*args)[0],
        value_loss_fn=lambda *args: value_loss(*args)[0])
    default.train(steps=2)
    passed.train(steps=2)
    assert numbers(default.history) == numbers(passed.history)
    assert default.last_update_stats == passed.last_update_stats
    for a, b in zip(default.model.policy_parameters(), passed.model.policy_parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_learners_gae_loop_and_clip_loss_train_the_model(make_trainer):
    calls = {"advantage_fn": 0, "policy_loss_fn": 0}

    def counted(name, fn):
        def wrapper(*args):
            calls[name] += 1
            return fn(*args)
        return wrapper

    # no whitening: the batch's advantages are then the loop's own, compared with the library's below
    trainer = make_trainer(advantage_fn=counted("advantage_fn", gae_loop),
                           policy_loss_fn=counted("policy_loss_fn", clip_loss), whiten_advantages=False)
    before = [p.detach().clone() for p in trainer.model.policy_parameters()]
    trainer.train(steps=2)
    config = trainer.config
    minibatches = config.ppo_epochs * config.rollout_batch_size // config.mini_batch_size
    assert calls == {"advantage_fn": 2, "policy_loss_fn": 2 * minibatches}
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.policy_parameters(), strict=True))
    # the library's GAE on the same rewards agrees up to float32 rounding. Both sum the same T terms
    # (gamma lam)^k delta_{t+k}, each at most |delta| in size (gamma lam <= 1), in another order: each result
    # is within T eps32 sum_u |delta_u| of the exact sum, so the two within twice that, derived from this
    # batch's own deltas rather than tuned on one CPU.
    batch = trainer.last_batch
    expected, _ = compute_gae(batch.rewards, batch.values, batch.mask, config.gamma, config.lam)
    next_values = torch.cat([batch.values[:, 1:], torch.zeros_like(batch.values[:, :1])], dim=1) * batch.mask
    delta = (batch.rewards + config.gamma * next_values - batch.values) * batch.mask  # (B, T)
    T = batch.mask.shape[1]
    bound = 2 * T * torch.finfo(torch.float32).eps * float(delta.abs().sum(dim=1).max())
    torch.testing.assert_close(batch.advantages, expected, atol=bound + 1e-12, rtol=0)
    # the learner's loss returns no stats: they are measured, so the curves have every key
    for key in ("clipfrac", "approx_kl", "policy_loss", "value_loss", "entropy_update"):
        assert key in trainer.history[-1]


def test_a_group_relative_advantage_replaces_gae(make_trainer):
    """A variant as GRPO writes it (one group: the whole batch): A = (score - mean) / std on every token."""
    def batch_relative(rewards, values, mask, gamma, lam):
        score = (rewards * mask).sum(dim=1)  # (B,) the sequence's total reward
        advantage = (score - score.mean()) / (score.std() + 1e-6)  # (B,)
        advantages = advantage[:, None] * mask  # (B, T)
        return advantages, (score[:, None] * mask)  # the critic learns the sequence reward

    trainer = make_trainer(advantage_fn=batch_relative, whiten_advantages=False)
    trainer.train(steps=2)
    batch = trainer.last_batch
    score = (batch.rewards * batch.mask).sum(dim=1)
    expected = ((score - score.mean()) / (score.std() + 1e-6))[:, None] * batch.mask
    assert torch.equal(batch.advantages, expected)
    assert torch.isfinite(torch.tensor(trainer.history[-1]["policy_loss"]))


@pytest.mark.parametrize("name", ["shape_rewards_fn", "advantage_fn", "policy_loss_fn", "value_loss_fn"])
def test_a_piece_that_is_not_a_function_is_refused_by_name(make_trainer, name):
    with pytest.raises(ValueError, match=f"{name} must be a function"):
        make_trainer(**{name: 0.5})


def test_a_piece_returning_nan_stops_the_run_naming_what(make_trainer):
    from rlhf_helpers.core.checks import NonFiniteError

    trainer = make_trainer(advantage_fn=lambda r, v, m, g, lam: (r * float("nan"), r))
    with pytest.raises(NonFiniteError, match="advantages has .* NaN/inf value.* at PPO step 0"):
        trainer.step()


def test_none_pieces_and_partial_stats_fall_back_to_the_library(make_trainer):
    """None is the library's piece; stats a piece leaves out are measured by the library's loss."""
    default = make_trainer()
    fallback = make_trainer(shape_rewards_fn=None, advantage_fn=None, value_loss_fn=None,
                            policy_loss_fn=lambda *args: (policy_loss(*args)[0], {"clipfrac": policy_loss(*args)[1]
                                                                                  ["clipfrac"]}))
    default.train(steps=1)
    fallback.train(steps=1)
    assert numbers(default.history) == numbers(fallback.history)
