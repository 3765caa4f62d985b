"""Notebook 08's checks start every attempt from one state, whatever ran before it.

    start = ModelSnapshot(check_model)    # once, in the set-up cell
    with fresh_attempt(start, config, seed=3, who="make_experience") as (model, config):
        rollout = make_experience(model, samples, config)

`start` keeps a pristine copy of the check's model, which no attempt ever runs. Every attempt gets a
fresh deep copy of it, and of the check's config: whatever the attempt does to its objects (a
weight scaled in place, a forward hook, a method patched on the instance or a submodule,
`eos_token_id` changed, `.half()`, `peft.set_adapter`, a deleted head, a parameter replaced by one
of another shape, a frozen config's field forced) cannot reach the next attempt. What all copies
share, the model's classes and torch's functions, is recorded at set-up, put back after each attempt
and named (`course.capstone_patches`); so are torch's global modes (autograd on, the default dtype:
`ppo.learner_guard`). torch's, Python's and NumPy's random generators are seeded with `seed` for
the attempt, and the caller's states come back after it. The optimisers are the check's own, new
for every attempt (`capstone_run`). A weight the attempt should not have changed (any, or with
`trains` any outside the policy and value adapters) is named in an AssertionError too.

A copy costs little next to an attempt: the tiny profile's model (0.8M parameters) copies in about
30 ms, an attempt takes seconds. On the gpu profile the pristine copy and the attempt's hold two
more copies of the 135M model in GPU memory (about 0.3 GB each in bfloat16, 0.5 GB in float32), one
attempt's copy at a time.
"""

from __future__ import annotations

import copy
import functools
import inspect
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from rlhf_helpers.course.capstone_patches import SharedNamespaces
from rlhf_helpers.ppo.learner_guard import (
    global_modes,
    global_modes_kept,
    learner_call_guard,
    set_global_modes,
)


def _parts(model: Any) -> dict[str, str]:
    """The part a message names (the policy adapter, ...) of each named tensor of `model`; the
    rest is the base model."""
    named = (("the policy adapter", model.policy_parameters()),
             ("the value adapter and head", model.value_parameters()),
             ("the reward adapter", model.adapter_parameters("reward")),
             ("the reward head", list(model.score_head.parameters())))
    part_of = {id(param): part for part, params in named for param in params}
    return {name: part_of.get(id(param), "the base model")
            for name, param in model.named_parameters()}


class ModelSnapshot:
    """The state every check's attempt starts from: a pristine copy of the model (never run by an
    attempt), what the model's copies share (its classes, torch's functions) and torch's global
    modes."""

    def __init__(self, model: Any) -> None:
        self.model = copy.deepcopy(model)  #: the pristine copy: each attempt runs on a copy of it
        for param in self.model.parameters():
            param.grad = None
        self.modes = global_modes()  #: torch's global modes (autograd, default dtype, ...)
        self.shared = SharedNamespaces(model)  #: the classes' and torch's entries
        self.parts = _parts(self.model)  #: tensor name -> the part a message names
        #: the names of the tensors an update may change (the policy and value adapters')
        self.trained = {name for name, part in self.parts.items()
                        if part in ("the policy adapter", "the value adapter and head")}

    def fresh_model(self) -> Any:
        """A new copy of the pristine model, no gradient on any parameter."""
        return copy.deepcopy(self.model)

    def changed(self, model: Any, trains: bool = False) -> list[str]:
        """The parts of `model` (the policy adapter, ..., the base model) whose tensors differ from
        the pristine copy's (a tensor gone, or of another shape or dtype, included), leaving out
        the two trained adapters when `trains`."""
        try:
            tensors = dict(model.named_parameters()) | dict(model.named_buffers())
        except Exception:  # noqa: BLE001 - a model the attempt broke: every part is suspect
            return sorted(set(self.parts.values()))
        mine = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        changed = set()
        for name, value in mine.items():
            if trains and name in self.trained:
                continue
            now = tensors.get(name)
            if (now is None or now.shape != value.shape or now.dtype != value.dtype
                    or not torch.equal(now.detach().to(value.device), value.detach())):
                changed.add(self.parts.get(name, "the base model"))
        return sorted(changed)


def attempt_name(function: Any) -> str:
    """The name of a learner's function as a message gives it (through partials and wrappers)."""
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(inspect.unwrap(function), "__name__", "your function")


@contextmanager
def _shared_kept(start: ModelSnapshot, who: str) -> Iterator[None]:
    """Run the block with the model's classes and torch as `start` recorded them, then put back the
    caller's; AssertionError naming what the block patched (with the block's own error after it,
    when it raised too)."""
    with start.shared.recorded_state() as patched:
        try:
            yield
        except Exception as error:
            first = (str(error).splitlines() or [""])[0]
            raised = error
        else:
            raised = None
    if patched and raised is not None:
        raise AssertionError(f"{_patched_message(who, patched)}; then it raised "
                             f"{type(raised).__name__}: {first}") from raised
    if raised is not None:
        raise raised
    if patched:
        raise AssertionError(_patched_message(who, patched))


def _patched_message(who: str, patched: list[str]) -> str:
    return (f"your {who} patched {', '.join(patched)}, which every model shares (the training "
            "model too): the check put the original back; call your own function instead of "
            "replacing the library's or torch's")


@contextmanager
def fresh_attempt(start: ModelSnapshot, config: Any, seed: int, who: str,
                  trains: bool = False) -> Iterator[tuple[Any, Any]]:
    """Run the block as one attempt of the learner's function `who`, on a fresh copy of `start`'s
    model and of `config` (the pair it gives), seeded with `seed` (see the module's docstring);
    `trains`: the policy and value adapters may change (an update), nothing else may."""
    model, config = start.fresh_model(), copy.deepcopy(config)
    devices = [model.device] if model.device.type == "cuda" else []
    python_state, numpy_state = random.getstate(), np.random.get_state()
    # the outer block gives the caller's modes back; the inner ones name what the attempt changed
    with global_modes_kept(), torch.random.fork_rng(devices=devices):
        try:
            set_global_modes(start.modes)
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
            with _shared_kept(start, who), learner_call_guard(who):
                yield model, config
            parts = start.changed(model, trains)
        finally:
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
