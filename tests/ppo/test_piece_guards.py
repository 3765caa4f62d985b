"""The trainer's guard around its replaceable pieces (ppo/piece_checks.py, ppo/update_watch.py): a
piece may not change the trainer's tensors in place, a result it cannot use is refused naming the
piece and what it returned, an error inside a piece names the piece, no refusal leaves a
half-applied update, and an update loop that never steps is refused while a zero gradient is logged
for the doctor."""

from __future__ import annotations

import pytest
import torch

from rlhf_helpers.core.gae import compute_gae
from rlhf_helpers.core.kl import shape_rewards
from rlhf_helpers.core.losses import policy_loss, value_loss
from rlhf_helpers.ppo.piece_checks import PieceError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def weights(trainer) -> list[torch.Tensor]:
    """Copies of both adapters' trained tensors."""
    return [p.detach().clone()
            for p in trainer.model.policy_parameters() + trainer.model.value_parameters()]


def refused(trainer, message: str) -> PieceError:
    """One step of `trainer` is refused with `message`; no weight moved and no step was recorded."""
    before = weights(trainer)
    with pytest.raises(PieceError, match=message) as caught:
        trainer.step()
    assert all(torch.equal(a, b) for a,
               b in zip(before, weights(trainer), strict=True)), "an update was applied"
    assert trainer.history == [] and trainer.step_count == 0
    trained = trainer.model.policy_parameters() + trainer.model.value_parameters()
    assert all(p.grad is None
               for p in trained), "a gradient of the refused minibatch was left for the next one"
    return caught.value


# ------------------------------------------------------------------ in-place edits of the trainer's
# tensors
def zeroes_values(rewards, values, mask, gamma, lam):
    advantages, returns = compute_gae(rewards, values, mask, gamma, lam)
    values.zero_()  # the batch's old values: the value loss would clip around 0
    return advantages, returns


def subtracts_into_logprobs(scores, logprobs, ref_logprobs, mask, kl_coef):
    logprobs -= ref_logprobs  # the batch's old log-probs: every ratio of the update would be wrong
    return shape_rewards(scores, logprobs, torch.zeros_like(ref_logprobs), mask, kl_coef)[0]


def clamps_advantages(logprobs, old_logprobs, advantages, mask, eps):
    advantages.clamp_(-1.0, 1.0)
    return policy_loss(logprobs, old_logprobs, advantages, mask, eps)


def masks_returns(values, old_values, returns, mask, value_clip):
    returns.mul_(mask)
    return value_loss(values, old_values, returns, mask, value_clip)


@pytest.mark.parametrize(
    "piece, fn, argument",
    [
        ("advantage_fn", zeroes_values, "values"),
        ("shape_rewards_fn", subtracts_into_logprobs, "logprobs"),
        ("policy_loss_fn", clamps_advantages, "advantages"),
        ("value_loss_fn", masks_returns, "returns"),
    ],
)
def test_a_piece_that_changes_its_input_in_place_is_refused_naming_it(
        make_trainer, piece, fn, argument):
    refused(make_trainer(**{piece: fn}), f"{piece} changed its argument {argument} in place")


def test_an_update_loop_that_changes_the_batch_in_place_is_refused_and_undone(make_trainer):
    from test_pieces import update_loop

    def renormalises(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn):
        losses = update_loop(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn)
        # after its steps: the batch the metrics read
        batch.advantages.sub_(batch.advantages.mean())
        return losses

    trainer = make_trainer(update_fn=renormalises)
    refused(trainer, "update_fn changed its argument batch.advantages in place")
    for optimizer in (trainer.policy_opt.optimizer, trainer.value_opt.optimizer):
        # the Adam moments of the undone steps are gone too
        assert optimizer.state_dict()["state"] == {}


def test_the_worked_solutions_that_write_into_their_own_tensors_still_train(make_trainer):
    """Notebook 05's shaping (it adds the score into the rewards tensor it made) and a GAE loop
    filling its own advantages are not in-place edits of the trainer's tensors: they train as
    before."""

    def shaped_rewards(scores, logprobs, ref_logprobs, mask, beta):
        rewards = -beta * torch.where(mask.bool(), logprobs - ref_logprobs,
                                      torch.zeros_like(logprobs))
        rewards[torch.arange(len(scores)), mask.sum(dim=1).long() - 1] += scores
        return rewards

    from test_pieces import gae_loop

    mine = make_trainer(shape_rewards_fn=shaped_rewards, advantage_fn=gae_loop)
    library = make_trainer(shape_rewards_fn=lambda *args: shape_rewards(*args)[0])
    mine.train(steps=1)
    library.train(steps=1)
    torch.testing.assert_close(mine.last_batch.rewards, library.last_batch.rewards)


# ------------------------------------------------------------------ results the trainer cannot use
def detached_loss(*args):
    return policy_loss(*args)[0].detach()


def per_token_loss(logprobs, old_logprobs, advantages, mask, eps):
    return -(torch.exp(logprobs - old_logprobs) * advantages * mask)


@pytest.mark.parametrize(
    "pieces, message",
    [
        (
            {"advantage_fn": lambda r, v, m, g, lam: r},
            r"advantage_fn must return \(advantages, returns\): two floating "
            r"tensors of shape \(8, \d+\).*it returned a tensor of shape",
        ),
        (
            {"advantage_fn": lambda r, v, m, g, lam: (r, (r + v)[:, :-1])},
            "advantage_fn returned returns as a tensor of shape",
        ),
        (
            {"advantage_fn": lambda r, v, m, g, lam: (r.long(), r)},
            "advantage_fn returned advantages as a tensor of shape "
            r"\(8, \d+\), dtype torch.int64",
        ),
        (
            {"shape_rewards_fn": lambda *args: None},
            r"shape_rewards_fn must return rewards, or \(rewards, kl\).*it "
            "returned None",
        ),
        (
            {"shape_rewards_fn": lambda *args: (*shape_rewards(*args), 1.0)},
            "shape_rewards_fn must return .* it returned a tuple of 3",
        ),
        (
            {"policy_loss_fn": detached_loss},
            "policy_loss_fn returned a loss that does not require grad: a tensor of shape "
            r"\(\), dtype torch.float32, no grad",
        ),
        (
            {"policy_loss_fn": lambda *args: torch.tensor(0.0)},
            "policy_loss_fn returned a loss that does not require grad",
        ),
        (
            {"policy_loss_fn": lambda *args: policy_loss(*args)[0].item()},
            "policy_loss_fn returned a loss that is a float .*keep the loss a tensor",
        ),
        ({"policy_loss_fn": per_token_loss},
         r"policy_loss_fn returned a loss that is a tensor of shape \(4, \d+\)"),
        ({"policy_loss_fn": lambda *args: (policy_loss(*args)[0], None)},
         "policy_loss_fn returned .* with stats None"),
        ({"policy_loss_fn": lambda *args: (policy_loss(*args)[0], {"clipfrac": [0.1]})},
         "stat 'clipfrac' as a list"),
        # the value loss is refused after the policy loss of the same minibatch passed: still no
        # policy step
        (
            {"value_loss_fn": lambda *args: value_loss(*args)[0].detach()},
            "value_loss_fn returned a loss that does not require grad",
        ),
        (
            {"value_loss_fn": lambda *args: (*value_loss(*args), "extra")},
            "value_loss_fn must return .* it returned a tuple of 3",
        ),
    ],
)
def test_a_result_the_trainer_cannot_use_is_refused_before_any_step(make_trainer, pieces, message):
    refused(make_trainer(**pieces), message)


def test_an_error_inside_a_piece_names_the_piece_and_keeps_the_original(make_trainer):
    def unpacks_wrong(rewards, values, mask, gamma, lam):
        advantages, returns = compute_gae(rewards, values, mask, gamma, lam)[0]
        return advantages, returns

    error = refused(
        make_trainer(advantage_fn=unpacks_wrong),
        "advantage_fn raised ValueError: too many values to unpack"
    )
    assert isinstance(error.__cause__, ValueError) and "too many values" in str(error.__cause__)

    def reads_missing_stats(logprobs, old_logprobs, advantages, mask, eps):
        return policy_loss(logprobs, old_logprobs, advantages, mask, eps)[1]["no such stat"]

    error = refused(make_trainer(policy_loss_fn=reads_missing_stats),
                    "policy_loss_fn raised KeyError: 'no such")
    assert isinstance(error.__cause__, KeyError)


# ------------------------------------------------------------------ update loops: undone when
# refused, and trained
def steps_then(result):
    """An update loop that takes every minibatch step of test_pieces.update_loop, then returns
    `result` (raises it if it is an exception)."""
    from test_pieces import update_loop

    def loop(*args):
        update_loop(*args)
        if isinstance(result, Exception):
            raise result
        return result

    return loop


@pytest.mark.parametrize(
    "result, error, message",
    [
        (RuntimeError("the loop broke after its steps"), PieceError,
         "update_fn raised RuntimeError: the loop broke"),
        (None, ValueError, r"list of \(policy loss, value loss\) pairs"),
        ([(float("nan"), 0.0)], Exception, "update_fn's losses"),
    ],
)
def test_an_update_loop_that_fails_after_stepping_is_undone(make_trainer, result, error, message):
    trainer = make_trainer(update_fn=steps_then(result))
    before = weights(trainer)
    with pytest.raises(error, match=message):
        trainer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, weights(trainer), strict=True))
    # no Adam moment of an undone step
    assert trainer.policy_opt.optimizer.state_dict()["state"] == {}


def test_a_loss_refused_inside_an_update_loop_names_the_loss_piece(make_trainer):
    from test_pieces import update_loop

    refused(
        make_trainer(update_fn=update_loop, policy_loss_fn=detached_loss),
        "^policy_loss_fn returned a loss that does not require grad",
    )


def test_an_update_loop_that_never_steps_the_policy_is_refused(make_trainer):
    def forgets_the_policy_step(model, batch, policy_opt, value_opt, config,
                                generator, policy_loss_fn):
        P, losses = batch.context_length, []
        for rows in torch.randperm(len(batch), generator=generator).split(config.mini_batch_size):
            logp = model.policy_logprobs(batch.sequences[rows],
                                         batch.attention_mask[rows], P).float()
            loss = policy_loss_fn(logp, batch.old_logprobs[rows], batch.advantages[rows],
                                  batch.mask[rows], 0.2)
            policy_opt.zero_grad()
            policy_opt.step()  # no backward: no gradient to step on
            losses.append((float(loss.detach()), 0.0))
        return losses

    refused(
        make_trainer(update_fn=forgets_the_policy_step),
        "update_fn left the policy adapter's weights unchanged "
        r"at PPO step 0: it called policy_opt.step\(\) 2 time",
    )


def test_a_zero_policy_gradient_trains_on_and_is_logged_as_zero(make_trainer):
    """A loss multiplied by 0 or all-zero advantages: legitimate on one minibatch, so not refused;
    the update's mean policy_grad_norm is exactly 0 (what the doctor's "nothing trains" rule reads),
    for the library's update and for an update loop of one's own alike."""
    from test_pieces import update_loop

    zero_loss = {"policy_loss_fn": lambda *args: policy_loss(*args)[0] * 0}
    zero_advantages = {"advantage_fn": lambda r, v, m, g,
                       lam: (torch.zeros_like(r), compute_gae(r, v, m, g, lam)[1])}
    for pieces in (zero_loss, zero_advantages, {**zero_loss, "update_fn": update_loop}):
        trainer = make_trainer(**pieces)
        before = [p.detach().clone() for p in trainer.model.policy_parameters()]
        metrics = trainer.step()
        assert metrics["policy_grad_norm"] == 0.0, pieces
        assert all(torch.equal(a, b) for a,
                   b in zip(before, trainer.model.policy_parameters(), strict=True))
    healthy = make_trainer(update_fn=update_loop)
    assert healthy.step()["policy_grad_norm"] > 0.0
    # one norm per minibatch step
    assert len({row["policy_grad_norm"] for row in healthy.last_update_stats}) > 1


# ------------------------------------------------------------------ edits that bypass the version
# counter, results
def same_run(trainer, healthy, metrics: bool = True) -> None:
    """`trainer` (a piece that edits what it was given behind torch's back) kept the trainer's batch
    as `healthy` did, and (`metrics`) gave its metrics, so its edits reached nothing of the
    trainer's."""
    trainer.step()
    healthy.step()
    rows = [{k: v for k, v in row.items() if not k.startswith("time")}
            for row in trainer.history + healthy.history]
    assert not metrics or rows[0] == rows[1]
    for name in ("mask", "old_logprobs", "values", "rewards", "advantages", "returns"):
        assert torch.equal(getattr(trainer.last_batch, name),
                           getattr(healthy.last_batch, name)), name


def gae_then(edit):
    def advantage_fn(rewards, values, mask, gamma, lam):
        out = compute_gae(rewards, values, mask, gamma, lam)
        edit(values)
        return out

    return advantage_fn


@pytest.mark.parametrize(
    "pieces",
    [
        {"advantage_fn": gae_then(lambda values: values.data.zero_())},
        {"advantage_fn": gae_then(lambda values: values.numpy().__setitem__(slice(None), 0.0))},
        {"shape_rewards_fn": lambda s, lp, rl, m,
         k: (shape_rewards(s, lp, rl, m, k)[0], lp.data.zero_())[0]},
        {"policy_loss_fn": lambda lp, olp, adv, m,
         e: (policy_loss(lp, olp, adv, m, e)[0], m.data.zero_())[0]},
        {
            "value_loss_fn": lambda v, ov, ret, m, c: (
                value_loss(v, ov, ret, m, c)[0],
                ret.data.zero_(),
                m.numpy().__setitem__(slice(None), 0.0),
            )[0]
        },
    ],
    ids=["values.data", "values.numpy", "logprobs.data", "mask.data", "returns.data+mask.numpy"],
)
def test_an_edit_that_bypasses_the_version_counter_cannot_reach_the_trainers_tensors(
        make_trainer, pieces):
    library = {
        name: {
            "advantage_fn": compute_gae,
            "policy_loss_fn": policy_loss,
            "value_loss_fn": value_loss,
            "shape_rewards_fn": lambda *args: shape_rewards(*args)[0],
        }[name]
        for name in pieces
    }
    # a loss piece that edits its own copies after use changes its own gradient (autograd saved
    # them), never the batch; the rollout pieces' edits change nothing at all
    same_run(
        make_trainer(**pieces),
        make_trainer(**library),
        metrics="policy_loss_fn" not in pieces and "value_loss_fn" not in pieces,
    )


def test_an_update_loop_gets_copies_of_the_batch_and_the_config(make_trainer):
    from test_pieces import update_loop

    def sabotages(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn):
        losses = update_loop(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn)
        batch.mask.data.zero_()  # .data: no version bump
        batch.advantages = torch.zeros_like(batch.advantages)
        config.clip_eps = 50.0
        return losses

    trainer = make_trainer(update_fn=sabotages)
    same_run(trainer, make_trainer(update_fn=update_loop))
    assert trainer.config.clip_eps == make_trainer().config.clip_eps


@pytest.mark.parametrize("through_data", [False, True])
def test_an_update_loop_that_changes_frozen_weights_is_refused(make_trainer, through_data):
    from test_pieces import update_loop

    def edits_the_base(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn):
        losses = update_loop(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn)
        frozen = next(p for name, p in model.named_parameters() if "wte" in name)
        with torch.no_grad():
            (frozen.data if through_data else frozen).add_(0.01)
        return losses

    refused(make_trainer(update_fn=edits_the_base), r"update_fn changed frozen weights: \S*wte")


def test_an_update_loop_that_changes_frozen_weights_and_then_fails_says_both(make_trainer):
    def edits_the_base_then_fails(model, batch, policy_opt, value_opt, config,
                                  generator, policy_loss_fn):
        with torch.no_grad():
            next(p for name, p in model.named_parameters() if "wte" in name).add_(0.01)
        raise RuntimeError("oops")

    refused(make_trainer(update_fn=edits_the_base_then_fails),
            r"update_fn raised RuntimeError: oops; and update_fn changed frozen weights: \S*wte")


@pytest.mark.parametrize("losses", [[(10**400, 0)], [(True, False)]], ids=["huge", "booleans"])
def test_update_fn_losses_that_are_no_float_name_update_fn(make_trainer, losses):
    refused(
        make_trainer(update_fn=steps_then(losses)),
        r"update_fn must return a list of \(policy loss, value loss\) pairs of numbers.*(an int of "
        r"1329 bits.*Overflow|not a boolean)",
    )


@pytest.mark.parametrize(
    "value", [10**400, float("nan"), torch.tensor(1j), torch.tensor([0.1, 0.2])],
    ids=["huge", "nan", "complex", "two"]
)
def test_a_loss_stat_that_is_no_finite_number_is_refused_before_any_step(make_trainer, value):
    def odd_stat(*args):
        loss, stats = policy_loss(*args)
        return loss, {**stats, "clipfrac": value}

    error = refused(make_trainer(policy_loss_fn=odd_stat),
                    "policy_loss_fn returned the stat 'clipfrac' as")
    assert len(str(error)) < 300  # 10**400 is described, not printed


@pytest.mark.parametrize(
    "pieces, message",
    [
        (
            {"shape_rewards_fn": lambda *args: shape_rewards(*args)[0].to_sparse()},
            "shape_rewards_fn returned rewards as a sparse_coo tensor",
        ),
        (
            {"advantage_fn": lambda *args: tuple(x.bfloat16() for x in compute_gae(*args))},
            r"advantage_fn returned advantages as a tensor of shape \(8, \d+\), dtype "
            r"torch.bfloat16.*float32",
        ),
        (
            {"shape_rewards_fn": lambda *args: (shape_rewards(*args)[0],
                                                shape_rewards(*args)[1].double())},
            "shape_rewards_fn returned kl as .*dtype torch.float64.*float32",
        ),
    ],
)
def test_a_result_of_another_layout_or_dtype_is_refused_naming_the_piece(
        make_trainer, pieces, message):
    refused(make_trainer(**pieces), message)


@pytest.mark.parametrize(
    "pieces, message",
    [
        (
            {"value_loss_fn": lambda *args: torch.ones((), requires_grad=True)},
            "value_loss_fn .*its loss does not depend on the value adapter's weights",
        ),
        (
            {"policy_loss_fn": lambda *args: torch.ones((), requires_grad=True)},
            "policy_loss_fn .*its loss does not depend on the policy adapter's weights",
        ),
    ],
)
def test_a_loss_that_never_reaches_its_adapter_is_refused(make_trainer, pieces, message):
    refused(make_trainer(**pieces), message)
    # the entropy term reaches the policy adapter: the total loss trains it, so the run goes on
    make_trainer(entropy_coef=0.01,
                 policy_loss_fn=lambda *args: torch.ones((), requires_grad=True)).step()


@pytest.mark.parametrize("retain", [False, True], ids=["backward", "backward_retaining_the_graph"])
def test_a_loss_piece_that_runs_backward_itself_is_refused(make_trainer, retain):
    """Retaining the graph, the trainer's own backward would double the gradient; without, it would
    fail on a freed graph with an error that names no piece."""
    def backs_itself(*args):
        loss, stats = policy_loss(*args)
        loss.backward(retain_graph=retain)
        return loss, stats

    refused(make_trainer(policy_loss_fn=backs_itself), "policy_loss_fn ran backward\\(\\) itself")


def test_the_logged_stats_are_measured_on_the_log_probs_as_they_came(make_trainer):
    """A piece that edits its log-probs through .data (which `_version` misses) changes its own loss
    only: the stats the trainer measures for the curves read a copy taken before the call."""
    def bare_loss(*args):
        return policy_loss(*args)[0]

    def bare_loss_then_edits(logprobs, *rest):
        loss = policy_loss(logprobs, *rest)[0]
        logprobs.data.fill_(0.0)
        return loss

    plain, edited = (make_trainer(policy_loss_fn=bare_loss),
                     make_trainer(policy_loss_fn=bare_loss_then_edits))
    plain.step()
    edited.step()
    # same seed, same loss, same weights: equal
    for key in ("approx_kl", "clipfrac", "first_ratio"):
        assert plain.history[0][key] == edited.history[0][key], key


# ------------------------------------------------------------------ global modes a piece leaves set
def gae_with_float64_default(rewards, values, mask, gamma, lam):
    torch.set_default_dtype(torch.float64)  # every tensor made after this call would be float64
    return compute_gae(rewards, values, mask, gamma, lam)


def policy_loss_with_autograd_off(logprobs, old_logprobs, advantages, mask, eps):
    out = policy_loss(logprobs, old_logprobs, advantages, mask, eps)
    torch.set_grad_enabled(False)  # the next minibatch's forward pass would build no graph
    return out


@pytest.mark.parametrize(("pieces", "message"), [
    ({"advantage_fn": gae_with_float64_default}, "advantage_fn left the default dtype float64"),
    ({"policy_loss_fn": policy_loss_with_autograd_off},
     r"policy_loss_fn left autograd off \(torch.set_grad_enabled\(False\)\)"),
])
def test_a_piece_that_leaves_a_global_mode_changed_is_refused_and_the_mode_put_back(
        make_trainer, pieces, message):
    grad_enabled, dtype = torch.is_grad_enabled(), torch.get_default_dtype()
    try:
        refused(make_trainer(**pieces), message)
        assert (torch.is_grad_enabled(), torch.get_default_dtype()) == (grad_enabled, dtype)
    finally:  # a failing assertion must not poison the tests after it
        torch.set_grad_enabled(grad_enabled)
        torch.set_default_dtype(dtype)
