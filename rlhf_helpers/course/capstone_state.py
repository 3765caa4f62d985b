"""Notebook 08's checks start every attempt from one state, whatever ran before it.

    start = ModelSnapshot(check_model)    # once, in the set-up cell
    with fresh_attempt(check_model, start, seed=3, who="make_experience"):
        rollout = make_experience(check_model, samples, config)

An attempt starts from the state `start` recorded: every weight and buffer of the model, no gradient
on any parameter, each parameter's `requires_grad`, no instance attribute shadowing one of the
model's methods (a patched `policy_logprobs`), and torch's global modes of then (autograd on, the
default dtype: `ppo.learner_guard`); torch's, Python's and NumPy's random generators are seeded
with `seed`. The optimisers are the check's own, new for every attempt (`capstone_run`), so no
optimiser state carries over. After the attempt a weight it should not have changed (any, or with
`trains` any outside the policy and value adapters) and a global mode it left changed are named in
an AssertionError; either way the model is put back to `start`, and the caller's modes and random
states come back. So one bad attempt (a `make_experience` that scales a weight in place, a loop that
leaves autograd off) cannot make a later attempt fail, the worked solution included.
"""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from rlhf_helpers.ppo.learner_guard import (
    global_modes,
    global_modes_kept,
    learner_call_guard,
    set_global_modes,
)


def _parts(model: Any) -> dict[int, str]:
    """Each parameter (by id) of the parts a message names; the rest is the base model."""
    named = (("the policy adapter", model.policy_parameters()),
             ("the value adapter and head", model.value_parameters()),
             ("the reward adapter", model.adapter_parameters("reward")),
             ("the reward head", list(model.score_head.parameters())))
    return {id(param): part for part, params in named for param in params}


class ModelSnapshot:
    """A model's state to start every check's attempt from: each parameter's and buffer's values,
    each parameter's `requires_grad`, its instance attributes' names, and torch's global modes."""

    def __init__(self, model: Any) -> None:
        tensors = dict(model.named_parameters()) | dict(model.named_buffers())
        self.values = {name: t.detach().clone() for name, t in tensors.items()}  #: name -> copy
        #: parameter name -> requires_grad
        self.requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        self.attributes = set(vars(model))  #: the model's own attribute names
        self.modes = global_modes()  #: torch's global modes (autograd, default dtype, ...)

    def restore(self, model: Any) -> None:
        """Put `model` back to this state: the values, `requires_grad`, no gradient, and no method
        shadowed by an attribute set since."""
        tensors = dict(model.named_parameters()) | dict(model.named_buffers())
        with torch.no_grad():
            for name, value in self.values.items():
                if name in tensors:
                    tensors[name].copy_(value)
        for name, param in model.named_parameters():
            param.grad = None
            param.requires_grad_(self.requires_grad.get(name, param.requires_grad))
        for name in set(vars(model)) - self.attributes:
            if hasattr(type(model), name):  # e.g. model.policy_logprobs = a patched function
                delattr(model, name)

    def changed(self, model: Any, may_change: Collection[int] = ()) -> list[str]:
        """The parts of `model` (the policy adapter, ..., the base model) whose values differ from
        this state, leaving out the parameters whose ids are in `may_change`."""
        parts = _parts(model)
        tensors = dict(model.named_parameters()) | dict(model.named_buffers())
        changed = {parts.get(id(t), "the base model") for name, t in tensors.items()
                   if id(t) not in may_change and name in self.values
                   and not torch.equal(t.detach(), self.values[name])}
        return sorted(changed)


def attempt_name(function: Any) -> str:
    """The name of a learner's function as a message gives it (through partials and wrappers)."""
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(inspect.unwrap(function), "__name__", "your function")


@contextmanager
def fresh_attempt(model: Any, start: ModelSnapshot, seed: int, who: str,
                  trains: bool = False) -> Iterator[None]:
    """Run the block as one attempt of the learner's function `who` from `start` (see the module's
    docstring); `trains`: the policy and value adapters may change (an update), nothing else may."""
    devices = [model.device] if model.device.type == "cuda" else []
    python_state, numpy_state = random.getstate(), np.random.get_state()
    may_change = ({id(p) for p in model.policy_parameters() + model.value_parameters()}
                  if trains else set())
    # the outer block gives the caller's modes back; the inner one names what the attempt changed
    with global_modes_kept(), torch.random.fork_rng(devices=devices):
        try:
            start.restore(model)
            set_global_modes(start.modes)
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
            with learner_call_guard(who):
                yield
            parts = start.changed(model, may_change)
        finally:
            start.restore(model)
            random.setstate(python_state)
            np.random.set_state(numpy_state)
    if parts and trains:
        raise AssertionError(
            f"your {who} changed weights that do not train ({', '.join(parts)}): only the policy "
            "and value adapters (model.policy_parameters(), model.value_parameters()) may change; "
            "the check put them back")
    if parts:
        raise AssertionError(f"your {who} changed the model's weights ({', '.join(parts)}): it "
                             "should only read them; the check put them back")
