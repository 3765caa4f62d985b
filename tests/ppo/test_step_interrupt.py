"""An interrupted PPO step applies no part of itself: Ctrl-C (or any error) after some minibatches
have stepped leaves every adapter weight, optimiser state, the KL controller, the step count, the
history and the RNGs (torch's, Python's, NumPy's) as before the step, for the library's update and a
caller's `update_fn` alike, the optimisers' param groups included, and `train()` again gives the
weights of an uninterrupted run."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest
import torch
from test_pieces import update_loop

from rlhf_helpers.ppo import step_undo

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def global_rng_loop(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn):
    """A learner's update loop that shuffles with the global RNG (no generator of its own)."""
    shuffle = torch.Generator().manual_seed(int(torch.randint(2**31, ())))
    return update_loop(model, batch, policy_opt, value_opt, config, shuffle, policy_loss_fn)


def python_numpy_loop(model, batch, policy_opt, value_opt, config, generator, policy_loss_fn):
    """A learner's update loop that shuffles with Python's and NumPy's global RNGs."""
    seed = int(np.random.randint(2**31)) ^ random.getrandbits(31)
    shuffle = torch.Generator().manual_seed(seed)
    return update_loop(model, batch, policy_opt, value_opt, config, shuffle, policy_loss_fn)


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def trainer_state(trainer) -> dict[str, Any]:
    """Copies of everything a step may change."""
    params = trainer.model.policy_parameters() + trainer.model.value_parameters()
    return {
        "weights": [p.detach().clone() for p in params],
        "grads": [None if p.grad is None else p.grad.clone() for p in params],
        "optimizers": [copy.deepcopy(opt.optimizer.state_dict())
                       for opt in (trainer.policy_opt, trainer.value_opt)],
        "scalers": [opt.scaler.state_dict() if opt.scaler.is_enabled() else None
                    for opt in (trainer.policy_opt, trainer.value_opt)],
        "overflow_skips": [trainer.policy_opt.overflow_skips, trainer.value_opt.overflow_skips],
        "kl_controller": dict(vars(trainer.kl_controller)),
        "step": trainer.step_count,
        "history": copy.deepcopy(trainer.history),
        "last_batch": trainer.last_batch,
        "last_update_stats": copy.deepcopy(trainer.last_update_stats),
        "rng": torch.random.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": [np.random.get_state()[1].tolist(), *np.random.get_state()[2:]],
        "param_groups": [len(opt.optimizer.param_groups)
                         for opt in (trainer.policy_opt, trainer.value_opt)],
    }


def assert_same(got: Any, expected: Any, where: str = "state") -> None:
    """Exact equality, tensors included, naming the first difference."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, expected), where
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys(), where
        for key in expected:
            assert_same(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(got) == len(expected), where
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif expected is None or not isinstance(expected, int | float | str | bool):
        assert got is expected, where  # the same object (the latest batch)
    else:
        assert got == expected, where


def without_times(history):
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in history]


CASES = {  # (update loop, base dtype, what interrupts the step)
    "library": (None, torch.float32, KeyboardInterrupt),
    "library-fp16": (None, torch.float16, KeyboardInterrupt),  # loss scalers mid-step
    "update_fn": (global_rng_loop, torch.float32, KeyboardInterrupt),
    "update_fn-python-numpy": (python_numpy_loop, torch.float32, KeyboardInterrupt),
    "library-error": (None, torch.float32, RuntimeError),
}


@pytest.mark.parametrize("case", CASES)
def test_an_interrupted_step_applies_nothing_and_train_again_matches_an_uninterrupted_run(
        make_trainer, monkeypatch, case):
    """Before: the library's update kept the minibatches already stepped and redid the step on top
    of them; a caller's `update_fn` got its weights back but not the RNG it drew from."""
    loop, dtype, interrupt = CASES[case]
    # an adaptive KL controller: its beta moves every step
    settings = {"target_kl": 0.5, "dtype": dtype, **({"update_fn": loop} if loop else {})}
    reference = make_trainer(**settings)
    seed_all(7)
    reference.train(steps=3)
    trainer = make_trainer(**settings)
    seed_all(7)
    trainer.train(steps=1)  # Adam holds moments and a step count to keep
    before = trainer_state(trainer)
    value_step = trainer.value_opt.optimizer.step

    def step_then_interrupt(*args, **kwargs):
        value_step(*args, **kwargs)  # the first minibatch's policy and value steps are applied
        raise interrupt("Ctrl-C (simulated)")

    monkeypatch.setattr(trainer.value_opt.optimizer, "step", step_then_interrupt)
    with pytest.raises(interrupt) as caught:
        trainer.train(steps=1)
    assert_same(trainer_state(trainer), before)
    assert any("PPO step 1 was undone" in note for note in caught.value.__notes__)
    monkeypatch.undo()
    trainer.train(steps=2)
    assert_same(trainer_state(trainer)["weights"], trainer_state(reference)["weights"])
    assert_same(trainer_state(trainer)["optimizers"], trainer_state(reference)["optimizers"])
    assert without_times(trainer.history) == without_times(reference.history)


@pytest.mark.parametrize("change", ["added", "removed"])
def test_a_step_that_changed_the_optimisers_param_groups_is_undone_whole(make_trainer, change):
    """Before: putting back the param groups zipped them with the copies (ValueError: zip() argument
    2 is shorter) and left the value optimiser, KL controller and step count not put back."""
    interrupt = {"now": False}

    def group_changing_loop(model, batch, policy_opt, value_opt, config, generator, loss_fn):
        losses = update_loop(model, batch, policy_opt, value_opt, config, generator, loss_fn)
        if interrupt["now"]:
            if change == "added":
                policy_opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
            else:
                value_opt.param_groups.pop()
            raise KeyboardInterrupt
        return losses

    reference = make_trainer(update_fn=group_changing_loop)
    seed_all(7)
    reference.train(steps=3)
    trainer = make_trainer(update_fn=group_changing_loop)
    seed_all(7)
    trainer.train(steps=1)
    before = trainer_state(trainer)
    interrupt["now"] = True
    with pytest.raises(KeyboardInterrupt):
        trainer.train(steps=1)
    assert_same(trainer_state(trainer), before)
    interrupt["now"] = False
    trainer.train(steps=2)
    assert_same(trainer_state(trainer)["weights"], trainer_state(reference)["weights"])
    assert_same(trainer_state(trainer)["optimizers"], trainer_state(reference)["optimizers"])


def test_every_part_is_put_back_even_when_one_fails(make_trainer, monkeypatch):
    """Before: the first part that failed to be put back stopped the undo, leaving the rest of the
    step applied (a half-restored trainer) and an error that did not say so."""
    trainer = make_trainer()
    trainer.step()
    before = trainer_state(trainer)
    value_step, restore_optimizer = trainer.value_opt.optimizer.step, step_undo._restore_optimizer

    def step_then_interrupt(*args, **kwargs):
        value_step(*args, **kwargs)
        raise KeyboardInterrupt

    def policy_fails(adapter_opt, saved):
        if adapter_opt is trainer.policy_opt:
            raise RuntimeError("cannot put it back (simulated)")
        restore_optimizer(adapter_opt, saved)

    monkeypatch.setattr(trainer.value_opt.optimizer, "step", step_then_interrupt)
    monkeypatch.setattr(step_undo, "_restore_optimizer", policy_fails)
    with pytest.raises(RuntimeError, match=r"PPO step 1 was interrupted \(KeyboardInterrupt\) "
                       r"and could not be undone whole: the policy optimiser \(RuntimeError: "
                       r"cannot put it back") as caught:
        trainer.step()
    assert isinstance(caught.value.__cause__, KeyboardInterrupt)
    after = trainer_state(trainer)
    for part in ("kl_controller", "step", "history", "last_batch", "rng", "python_rng"):
        assert_same(after[part], before[part], part)
    assert_same(after["optimizers"][1], before["optimizers"][1], "the value optimiser")


def test_an_interrupted_update_called_alone_is_undone_too(make_trainer, monkeypatch):
    """`PPOTrainer.update` on a batch of one's own (notebook 08's check runs it so) follows the same
    rule as `step`."""
    trainer = make_trainer()
    trainer.step()
    before = trainer_state(trainer)
    policy_step = trainer.policy_opt.optimizer.step
    calls = []

    def second_step_interrupts(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        policy_step(*args, **kwargs)

    monkeypatch.setattr(trainer.policy_opt.optimizer, "step", second_step_interrupts)
    with pytest.raises(KeyboardInterrupt):
        trainer.update(trainer.last_batch, torch.Generator().manual_seed(0))
    assert len(calls) == 2
    assert_same(trainer_state(trainer), before)


def test_an_adapter_switch_cut_short_is_redone_whole(make_trainer, monkeypatch):
    """Before: Ctrl-C in the middle of switching the LoRA layers to the value adapter left the model
    recorded as on the policy, so the next switch to the policy was skipped and some layers stayed
    on the value adapter."""
    model = make_trainer().model
    model.use("policy")
    layer = model._lora_layers[1]
    switch = layer.set_adapter

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(layer, "set_adapter", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.use("value")
    monkeypatch.setattr(layer, "set_adapter", switch)
    model.use("policy")
    assert {tuple(layer.active_adapters) for layer in model._lora_layers} == {("policy",)}


def test_a_second_ctrl_c_while_the_step_is_put_back_still_leaves_it_undone(make_trainer,
                                                                            monkeypatch):
    """An impatient second Ctrl-C lands while the copy is being put back: it is put back whole."""
    from rlhf_helpers.ppo import step_undo

    trainer = make_trainer()
    trainer.step()
    before = trainer_state(trainer)
    value_step = trainer.value_opt.optimizer.step

    def step_then_interrupt(*args, **kwargs):
        value_step(*args, **kwargs)
        raise KeyboardInterrupt

    restore_rng, calls = step_undo._restore_rng, []

    def second_ctrl_c(*args, **kwargs):  # the last thing put back: the rest is done already
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        restore_rng(*args, **kwargs)

    monkeypatch.setattr(trainer.value_opt.optimizer, "step", step_then_interrupt)
    monkeypatch.setattr(step_undo, "_restore_rng", second_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        trainer.step()
    assert len(calls) == 2
    assert_same(trainer_state(trainer), before)
