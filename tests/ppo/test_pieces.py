"""PPOTrainer's replaceable maths (ppo/pieces.py): a user's shaping, advantages and losses drive
real training."""

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
    """A learner's clipped loss, a bare scalar: -mean over real tokens of min(rho A, clip(rho)
    A)."""
    ratio = torch.exp(logprobs - old_logprobs)
    objective = torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - eps, 1 + eps) * advantages)
    return -(objective * mask).sum() / mask.sum()


def test_library_pieces_given_as_bare_functions_give_the_same_run_to_the_bit(make_trainer):
    """The default run, and the same maths passed in as bare-result functions: identical metrics and
    weights. The trainer then measures the stats with the library's loss on the same inputs, so
    nothing is lost."""
    default = make_trainer()
    passed = make_trainer(
        # rewards only: the trainer adds the k1 kl
        shape_rewards_fn=lambda *args: shape_rewards(*args)[0],
        advantage_fn=lambda *args: compute_gae(*args),
        policy_loss_fn=lambda *args: policy_loss(*args)[0],
        value_loss_fn=lambda *args: value_loss(*args)[0])
    default.train(steps=2)
    passed.train(steps=2)
    assert numbers(default.history) == numbers(passed.history)
    assert default.last_update_stats == passed.last_update_stats
    for a, b in zip(default.model.policy_parameters(),
                    passed.model.policy_parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_learners_gae_loop_and_clip_loss_train_the_model(make_trainer):
    calls = {"advantage_fn": 0, "policy_loss_fn": 0}

    def counted(name, fn):
        def wrapper(*args):
            calls[name] += 1
            return fn(*args)
        return wrapper

    # no whitening: the batch's advantages are then the loop's own, compared with the library's
    # below
    trainer = make_trainer(advantage_fn=counted("advantage_fn", gae_loop),
                           policy_loss_fn=counted("policy_loss_fn", clip_loss),
                           whiten_advantages=False)
    before = [p.detach().clone() for p in trainer.model.policy_parameters()]
    trainer.train(steps=2)
    config = trainer.config
    minibatches = config.ppo_epochs * config.rollout_batch_size // config.mini_batch_size
    assert calls == {"advantage_fn": 2, "policy_loss_fn": 2 * minibatches}
    assert any(not torch.equal(a, b) for a,
               b in zip(before, trainer.model.policy_parameters(), strict=True))
    # the library's GAE on the same rewards agrees up to float32 rounding. Both sum the same T terms
    # (gamma lam)^k delta_{t+k}, each at most |delta| in size (gamma lam <= 1), in another order:
    # each result is within T eps32 sum_u |delta_u| of the exact sum, so the two within twice that,
    # derived from this batch's own deltas rather than tuned on one CPU.
    batch = trainer.last_batch
    expected, _ = compute_gae(batch.rewards, batch.values, batch.mask, config.gamma, config.lam)
    next_values = torch.cat([batch.values[:, 1:], torch.zeros_like(batch.values[:, :1])],
                            dim=1) * batch.mask
    delta = (batch.rewards + config.gamma * next_values - batch.values) * batch.mask  # (B, T)
    T = batch.mask.shape[1]
    bound = 2 * T * torch.finfo(torch.float32).eps * float(delta.abs().sum(dim=1).max())
    torch.testing.assert_close(batch.advantages, expected, atol=bound + 1e-12, rtol=0)
    # the learner's loss returns no stats: they are measured, so the curves have every key
    for key in ("clipfrac", "approx_kl", "policy_loss", "value_loss", "entropy_update"):
        assert key in trainer.history[-1]


def test_a_group_relative_advantage_replaces_gae(make_trainer):
    """A variant as GRPO writes it (one group: the whole batch): A = (score - mean) / std on every
    token."""
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


@pytest.mark.parametrize("name",
                         ["shape_rewards_fn", "advantage_fn", "policy_loss_fn", "value_loss_fn"])
def test_a_piece_that_is_not_a_function_is_refused_by_name(make_trainer, name):
    with pytest.raises(ValueError, match=f"{name} must be a function"):
        make_trainer(**{name: 0.5})


def test_a_piece_returning_nan_stops_the_run_naming_what(make_trainer):
    from rlhf_helpers.core.checks import NonFiniteError

    trainer = make_trainer(advantage_fn=lambda r, v, m, g, lam: (r * float("nan"), r))
    with pytest.raises(NonFiniteError, match="advantages returned by advantage_fn has .* NaN/inf "
                                             "value.* at PPO step 0"):
        trainer.step()


def test_none_pieces_and_partial_stats_fall_back_to_the_library(make_trainer):
    """None is the library's piece; stats a piece leaves out are measured by the library's loss."""
    default = make_trainer()
    fallback = make_trainer(shape_rewards_fn=None, advantage_fn=None, value_loss_fn=None,
                            policy_loss_fn=lambda *args: (policy_loss(*args)[0],
                                                          {"clipfrac": policy_loss(*args)[1]
                                                           ["clipfrac"]}))
    default.train(steps=1)
    fallback.train(steps=1)
    assert numbers(default.history) == numbers(fallback.history)


def update_loop(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn):
    """A learner's update loop, written from the equations: no column trimming, the value loss
    inline."""
    P, B, losses = batch.context_length, len(batch), []
    for _ in range(config.ppo_epochs):
        order = torch.randperm(B, generator=generator)  # (B,)
        for first in range(0, B, config.mini_batch_size):
            rows = order[first : first + config.mini_batch_size]
            seq, attn, m = batch.sequences[rows], batch.attention_mask[rows], batch.mask[rows]
            logp = model.policy_logprobs(seq, attn, P,
                                         temperature=config.temperature).float()  # (b, R)
            pg = policy_loss_fn(logp, batch.old_logprobs[rows], batch.advantages[rows],
                                m, config.clip_eps)
            policy_opt.zero_grad()
            pg.backward()
            torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)
            policy_opt.step()
            V, V_old, G = model.values(seq, attn,
                                       P).float(), batch.values[rows], batch.returns[rows]
            V_clip = V_old + (V - V_old).clamp(-config.value_clip, config.value_clip)  # (b, R)
            v = 0.5 * (torch.max((V - G) ** 2, (V_clip - G) ** 2) * m).sum() / m.sum()
            value_opt.zero_grad()
            (config.vf_coef * v).backward()
            torch.nn.utils.clip_grad_norm_(model.value_parameters(), config.max_grad_norm)
            value_opt.step()
            losses.append((pg.item(), v.item()))
    return losses


def with_sgd(trainer, lr=0.5):
    """The trainer's two optimisers swapped for plain SGD: two correct loops then differ only by
    rounding (Adam divides by sqrt(v), so where a gradient is ~0 rounding picks the direction of a
    full step)."""
    trainer.policy_opt.optimizer = torch.optim.SGD(trainer.model.policy_parameters(), lr=lr)
    trainer.value_opt.optimizer = torch.optim.SGD(trainer.model.value_parameters(), lr=lr)
    return trainer


def moved_policy(trainer, scale=0.3):
    """The policy adapter set to seeded random weights: the policy is no longer the reference, so a
    loop that takes the reference's log-probs as the old ones gives other losses."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in trainer.model.policy_parameters():
            param.copy_(scale * torch.randn(param.shape, generator=g))
    return trainer


def test_an_update_loop_of_ones_own_trains_like_the_library_update(make_trainer):
    """From the same weights and the same batch, a loop written from the equations (update_fn) gives
    the library update's losses and weights, and its curves keep the clip loss's stats."""
    # not 1: a loop that leaves it out differs
    library = with_sgd(moved_policy(make_trainer(vf_coef=0.5)))
    mine = with_sgd(moved_policy(make_trainer(update_fn=update_loop, vf_coef=0.5)))
    library.step()
    mine.step()
    got = torch.tensor([(row["policy_loss"], row["value_loss"]) for row in mine.last_update_stats])
    expected = torch.tensor(
        [(row["policy_loss"], row["value_loss"]) for row in library.last_update_stats])
    # float32: the library cuts each minibatch to its real columns, so its matrix products sum in
    # another order (~1e-7 relative per product, a few hundred products deep); SGD keeps a
    # difference at the size of the rounding that made it. 1e-4 relative is three orders above that
    # and far below what a wrong loop moves.
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for a, b in zip(mine.model.policy_parameters(), library.model.policy_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert {"clipfrac", "approx_kl"} <= mine.history[-1].keys()
    for row, reference in zip(mine.last_update_stats, library.last_update_stats, strict=True):
        assert abs(row["approx_kl"]
                   - reference["approx_kl"]) <= 1e-4 + 1e-3 * abs(reference["approx_kl"])


def test_an_update_loop_that_moves_nothing_is_refused(make_trainer):
    """A loop that never steps its optimiser would let the run go on without training: refused,
    naming update_fn."""
    from rlhf_helpers.ppo.piece_checks import PieceError

    def lazy(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn):
        return [(0.0, 0.0)]

    trainer = make_trainer(update_fn=lazy)
    before = [p.detach().clone() for p in trainer.model.policy_parameters()]
    with pytest.raises(PieceError, match="update_fn left the policy adapter's weights unchanged at "
                                         "PPO step 0: it "
                                         r"called policy_opt.step\(\) 0 time"):
        trainer.step()
    assert trainer.history == []
    assert all(torch.equal(a, b) for a,
               b in zip(before, trainer.model.policy_parameters(), strict=True))


@pytest.mark.parametrize("setting, message", [({"entropy_coef": 0.01}, "entropy_coef must be 0"),
                                              ({"ptx_coef": 0.1}, "ptx_coef must be 0"),
                                              ({"value_warmup_steps": 1},
                                               "value_warmup_steps must be 0")])
def test_update_fn_refuses_settings_it_cannot_honour(make_trainer, setting, message):
    kwargs = {"ptx_texts": ["the movie was good ."]} if "ptx_coef" in setting else {}
    with pytest.raises(ValueError, match=f"update_fn .*{message}"):
        make_trainer(update_fn=update_loop, **setting, **kwargs)


@pytest.mark.parametrize("result, error, message", [
    (None, ValueError, "list of \\(policy loss, value loss\\) pairs"),
    ([], ValueError, "returned no losses"),
    ([(float("nan"), 0.0)], Exception, "update_fn's losses"),
])
def test_update_fn_results_are_checked(make_trainer, result, error, message):
    trainer = make_trainer(update_fn=lambda *args: result)
    with pytest.raises(error, match=message):
        trainer.step()


def test_the_pieces_record_exactly_the_callers_own_functions(make_trainer):
    def my_loss(logprobs, old_logprobs, advantages, mask, clip_eps):
        return policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps)

    # the library's own function given by name is not the caller's: it runs unchecked
    trainer = make_trainer(policy_loss_fn=my_loss, advantage_fn=compute_gae,
                           value_loss_fn=value_loss)
    assert dict(trainer.pieces.given) == {"policy_loss_fn": my_loss}
    assert trainer.own_pieces == {"policy_loss_fn": my_loss}
    assert make_trainer().own_pieces == {}

    def my_update(model, batch, policy_opt, value_opt, config, generator, loss_fn):
        return []

    assert make_trainer(update_fn=my_update).own_pieces == {"update_fn": my_update}
    # a shaping function given, even the library's, runs checked and without the config's kl_kind
    # and score_clip: it is the caller's
    assert make_trainer(shape_rewards_fn=shape_rewards).own_pieces == {
        "shape_rewards_fn": shape_rewards}


def test_a_value_loss_beside_an_update_fn_is_refused_as_never_run(make_trainer):
    def my_value_loss(values, old_values, returns, mask, value_clip):
        return value_loss(values, old_values, returns, mask, value_clip)

    with pytest.raises(ValueError, match="value_loss_fn would never run: an update_fn computes"):
        make_trainer(update_fn=update_loop, value_loss_fn=my_value_loss)
    make_trainer(update_fn=update_loop, value_loss_fn=value_loss)  # the library's: nothing lost
