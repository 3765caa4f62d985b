"""A PPO iteration is applied whole or not at all: what `PPOTrainer.step` changes is copied before
it runs and put back when it does not finish (Ctrl-C, a NaN stop, a refused piece, any error).

    with undone_on_error(trainer, "PPO step 3"):   # copies the trained state
        ...                                        # an exception here puts it back, then re-raises

What is copied: every trained weight (the policy and value adapters, the value head) and its
gradient; each optimiser's state (Adam's moments and step counts, its hyper-parameters), loss scaler
and overflow count; the KL controller; the trainer's step count, history, latest batch and
minibatch stats (`last_update_stats`: the update loop returns its rows and the trainer records them
once it finishes); the global RNG states, torch's, Python's `random` and NumPy's (a caller's
`update_fn` may draw from any of them). The optimisers' param groups are put back whole: a group
the step added is dropped, one it removed comes back. The library's update loop
(`iteration.update_epochs`) and a caller's `update_fn` are under the same rule: after an interrupted
step every adapter and optimiser state is exactly as before it, so `train()` or `step()` runs that
step again from the start and gives the numbers an uninterrupted run gives. The exception gets a
note that says so.

Each part is put back even when another fails (StepUndoError then names the parts not put back),
so no error leaves a trainer half restored without saying so.

Cost: one copy of the adapters and of Adam's two moments per step (LoRA adapters are small: a few
MB on the gpu profile), no copy of the frozen base. Blocks nest: `PPOTrainer.update` inside `step`
is covered by the step's copy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

#: ids of the trainers inside an `undone_on_error` block: an inner block (`PPOTrainer.update` in
#: `step`) copies nothing
_COVERED: set[int] = set()


class StepUndoError(RuntimeError):
    """Some part of an interrupted step could not be put back; the message names each (the other
    parts were put back) and the step's own error is its cause."""


def _copied(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _optimizer_state(adapter_opt: Any) -> dict[str, Any]:
    """One `optim.AdapterOptimizer`'s trained tensors, gradients, optimiser and scaler state."""
    optimizer = adapter_opt.optimizer  # a torch optimiser (notebook 08's check swaps in its own)
    params = list({id(p): p for p in [*adapter_opt.params, *(
        p for group in optimizer.param_groups for p in group["params"])]}.values())
    scaler = adapter_opt.scaler
    return {
        "optimizer": optimizer,
        "params": params,
        "weights": [p.detach().clone() for p in params],
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in params],
        "state": {p: {k: _copied(v) for k, v in s.items()} for p, s in optimizer.state.items()},
        # the list whole, each group's dict and params list: a step may add or remove groups
        "group_list": list(optimizer.param_groups),
        "groups": [({k: _copied(v) for k, v in g.items() if k != "params"}, list(g["params"]))
                   for g in optimizer.param_groups],
        "scaler": scaler.state_dict() if scaler.is_enabled() else None,
        "overflow_skips": adapter_opt.overflow_skips,
    }


def _restore_optimizer(adapter_opt: Any, saved: dict[str, Any]) -> None:
    optimizer = adapter_opt.optimizer = saved["optimizer"]
    with torch.no_grad():
        for param, weight, grad in zip(saved["params"], saved["weights"], saved["grads"],
                                       strict=True):
            param.copy_(weight)
            param.grad = grad
    optimizer.state.clear()
    optimizer.state.update(saved["state"])
    optimizer.param_groups[:] = saved["group_list"]
    for group, (hyper, params) in zip(saved["group_list"], saved["groups"], strict=True):
        group.clear()
        group.update(hyper, params=params)
    if saved["scaler"] is not None:
        adapter_opt.scaler.load_state_dict(saved["scaler"])
        # what the scaler recorded of this step (unscaled, infs found): the next step starts clean,
        # as after its `update()`
        adapter_opt.scaler._per_optimizer_states.clear()
    adapter_opt.overflow_skips = saved["overflow_skips"]


def _rng_states(device: torch.device) -> dict[str, Any]:
    states: dict[str, Any] = {"cpu": torch.random.get_rng_state(), "python": random.getstate(),
                              "numpy": np.random.get_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def _restore_rng(states: dict[str, Any], device: torch.device) -> None:
    torch.random.set_rng_state(states["cpu"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


@contextmanager
def undone_on_error(trainer: Any, what: str) -> Iterator[None]:
    """Run the block; if anything escapes it (KeyboardInterrupt included), put the trainer's trained
    state back as it was when the block began, note that on the exception, and re-raise. `what`
    names the block in the note ("PPO step 3")."""
    if id(trainer) in _COVERED:  # an enclosing block's copy covers this one
        yield
        return
    device = trainer.model.device
    saved = {
        "policy": _optimizer_state(trainer.policy_opt),
        "value": _optimizer_state(trainer.value_opt),
        "kl_controller": dict(vars(trainer.kl_controller)),
        "step_count": trainer.step_count,
        "history": (trainer.history, list(trainer.history)),
        "last_batch": trainer.last_batch,
        "last_update_stats": trainer.last_update_stats,
        "rng": _rng_states(device),
    }
    _COVERED.add(id(trainer))
    try:
        yield
    except BaseException as error:
        while True:  # a second Ctrl-C while the state is put back: finish putting it back first
            try:
                failed = _restore(trainer, saved, device)
                break
            except KeyboardInterrupt:
                continue
        if failed:
            raise StepUndoError(
                f"{what} was interrupted ({type(error).__name__}) and could not be undone whole: "
                f"{'; '.join(failed)}. Every other part was put back; rebuild the trainer (or "
                "load its last checkpoint) before training on") from error
        error.add_note(f"{what} was undone: every adapter weight, optimiser state (Adam's moments "
                       "and step counts), the KL controller, the step count and the history are "
                       "as they were before it, so running it again starts it afresh")
        raise
    finally:
        _COVERED.discard(id(trainer))


def _restore_trainer(trainer: Any, saved: dict[str, Any]) -> None:
    for key, value in saved["kl_controller"].items():
        setattr(trainer.kl_controller, key, value)
    trainer.step_count = saved["step_count"]
    history, rows = saved["history"]
    history[:] = rows  # the same list: a caller may hold it (`train` returns it)
    trainer.history = history
    trainer.last_batch = saved["last_batch"]
    trainer.last_update_stats = saved["last_update_stats"]


def _restore(trainer: Any, saved: dict[str, Any], device: torch.device) -> list[str]:
    """Put back what `undone_on_error` copied (again from the start if cut short), every part even
    when one fails; returns "the part: its error" of each part that failed."""
    parts: list[tuple[str, Callable[[], None]]] = [
        ("the policy optimiser", lambda: _restore_optimizer(trainer.policy_opt, saved["policy"])),
        ("the value optimiser", lambda: _restore_optimizer(trainer.value_opt, saved["value"])),
        ("the KL controller, step count and history", lambda: _restore_trainer(trainer, saved)),
        ("the RNG states", lambda: _restore_rng(saved["rng"], device)),
    ]
    failed = []
    for name, put_back in parts:
        try:
            put_back()
        except Exception as error:  # noqa: BLE001 - named in StepUndoError, the rest goes on
            failed.append(f"{name} ({type(error).__name__}: {error})")
    return failed
