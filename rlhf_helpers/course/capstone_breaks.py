"""Notebook 08's "break your iteration": a classmate's mistake injected into a learner's passing
iteration from outside (their code stays as it is), and what the check then says.

    broken = break_iteration(ppo_iteration, "no zero_grad")
    said = check_message(broken, model, tok, prompts, config, seeds, lrs, expected, rtol)

Each mistake of BREAKS is made by wrapping what the learner's code calls: the policy optimiser's
`zero_grad`, the model's `policy_logprobs` (its first call in an iteration is the experience's, the
later ones the update's), or the losses the iteration returns. `check_message` runs the check's
comparison and returns its message instead of raising, so a notebook cell can print it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from rlhf_helpers.course.capstone import first_difference
from rlhf_helpers.course.capstone_run import IterationRecord, run_iteration
from rlhf_helpers.course.capstone_state import ModelSnapshot
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: the mistakes `break_iteration` injects, each with what it does, in the learner's terms
BREAKS = {
    "no zero_grad": "policy_opt.zero_grad() does nothing, so each minibatch's policy gradient is "
                    "added to the ones before it",
    "half the policy gradient": "the update's log-probs pass on half their gradient, as a "
                                ".detach() on one branch of the min does inside the clip band",
    "reference as old": "the experience's log pi_old are the reference's log-probs (the bug of a "
                        "widely copied script, notebook 06)",
    "update at temperature 1": "the update recomputes the log-probs at temperature 1, the "
                               "sampling temperature forgotten",
    "vf_coef in the logged value loss": "the value loss the iteration returns is vf_coef x L^V",
}
#: the position of `temperature` among SharedLoRAModel.policy_logprobs's arguments
_TEMPERATURE_AT = 5


@contextmanager
def _instead(obj: Any, name: str, replacement: Any) -> Iterator[None]:
    """`obj.name` is `replacement` inside the block (an instance attribute shadows the method)."""
    setattr(obj, name, replacement)
    try:
        yield
    finally:
        delattr(obj, name)


def _policy_logprobs(model: Any, mistake: str) -> Callable[..., Any]:
    """model.policy_logprobs with `mistake` made: on its first call (the experience's) or on the
    later ones (the update's)."""
    original, calls = model.policy_logprobs, []

    def policy_logprobs(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        in_update = len(calls) > 1
        if mistake == "reference as old" and not in_update:
            temperature = kwargs.get("temperature", args[_TEMPERATURE_AT]
                                     if len(args) > _TEMPERATURE_AT else 1.0)
            where = {k: v for k, v in kwargs.items()
                     if k in ("input_ids", "attention_mask", "context_length")}
            return model.ref_logprobs(*args[:3], **where, temperature=temperature)
        if mistake == "update at temperature 1" and in_update:
            args = args[:_TEMPERATURE_AT]
            kwargs["temperature"] = 1.0
        out = original(*args, **kwargs)
        if mistake == "half the policy gradient" and in_update:
            halve = lambda x: 0.5 * x + 0.5 * x.detach()  # noqa: E731  # same value, half gradient
            out = tuple(map(halve, out)) if isinstance(out, tuple) else halve(out)
        return out

    return policy_logprobs


def break_iteration(iteration: Callable[..., Any], mistake: str) -> Callable[..., Any]:
    """`iteration` with the mistake `mistake` (a key of BREAKS) injected from outside."""
    if mistake not in BREAKS:
        raise ValueError(f"mistake must be one of {sorted(BREAKS)}, got {mistake!r}")

    def broken(model: Any, tokenizer: Any, prompts: Sequence[str],
               policy_opt: torch.optim.Optimizer, value_opt: torch.optim.Optimizer,
               config: PPOConfig, generator: torch.Generator) -> tuple[Any, list]:
        with (_instead(model, "policy_logprobs", _policy_logprobs(model, mistake)),
              _instead(policy_opt, "zero_grad", lambda *_, **__: None)
              if mistake == "no zero_grad" else _nothing()):
            rollout, losses = iteration(model, tokenizer, prompts, policy_opt, value_opt, config,
                                        generator)
        if mistake == "vf_coef in the logged value loss":
            losses = [(policy, config.vf_coef * value) for policy, value in losses]
        return rollout, losses

    return broken


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def check_message(iteration: Callable[..., Any], model: Any, tokenizer: Any,
                  prompts: Sequence[str], config: PPOConfig, seeds: tuple[int, int],
                  lrs: tuple[float, float], expected: IterationRecord, rtol: float,
                  start: ModelSnapshot | None = None) -> str:
    """What notebook 08's check says of `iteration` against the library's record `expected`: the
    first difference and its likely cause, the error it raised, or that it finds none. It runs from
    `start` as `run_iteration` does. Never raises."""
    try:
        got = run_iteration(iteration, model, tokenizer, prompts, config, seeds, lrs, start)
        problem = first_difference(got, expected, config, rtol)
    except Exception as error:  # the learner's code may fail in any way: report it, as a check does
        return f"{type(error).__name__}: {error}"
    return problem or ("no difference: this mistake changed nothing the check compares (your "
                       "iteration may not call what it wraps)")
