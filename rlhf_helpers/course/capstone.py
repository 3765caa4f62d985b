"""Notebook 08's check: a learner's whole PPO iteration against the library's, on the same batch and
seed.

    seeds, lrs = (3, 4), (2.0, 0.05)
    start = ModelSnapshot(model)  # every attempt starts from this state, whatever ran before
    expected = run_iteration(library_iteration, model, tok, prompts, config, seeds, lrs, start)
    got = run_iteration(ppo_iteration, model, tok, prompts, config, seeds, lrs, start)
    problem = first_difference(got, expected, config, rounding_rtol(model, config))  # None or where
    share = budget_used(got, expected, config, rtol)  # how much of the rounding budget it used

An iteration is `iteration(model, tokenizer, prompts, policy_opt, value_opt, config, generator) ->
(rollout, [(policy loss, value loss) of every minibatch])`, the rollout holding the experience under
`Experience`'s names. `run_iteration` (`course.capstone_run`, imported here) runs one from given
weights with plain SGD (the notebook says why), records what it made (on a copy:
the model passed in is never run).
`first_difference` names the first thing that differs, in the order the iteration makes it: the
experience (tokens, log-probs, values, scores, rewards, returns, advantages), then each minibatch's
losses, then the gradient norm of each optimiser step and the weights' updates, with the likely
cause (`course.capstone_hints`). The check code uses plain torch only: the library's maths are
hidden from the learner while it runs.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from rlhf_helpers.course.capstone_hints import experience_hint, far, loss_hint, step_hint
from rlhf_helpers.course.capstone_run import (
    EXPERIENCE,
    FLOAT32_UNIT_ROUNDOFF,
    IterationRecord,
    left_out_settings,
    library_iteration,
    rounding_rtol,
    run_experience,
    run_iteration,
)
from rlhf_helpers.course.capstone_state import ModelSnapshot
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: the check's names, with those of the recording half (`course.capstone_run`): the notebook and
#: the tests call them from here
__all__ = ["EXPERIENCE", "FLOAT32_UNIT_ROUNDOFF", "IterationRecord", "ModelSnapshot", "PassedCode",
           "budget_used", "experience_difference", "first_difference", "left_out_settings",
           "library_iteration", "rounding_rtol", "run_experience", "run_iteration"]


def _where(mask: torch.Tensor, i: int, t: int) -> str:
    n = int(mask[i].sum())
    return (f"row {i}, token {t}: "
            + ["the last real token", "a real token before the last"][int(t < n - 1)]
            + f" of a row with {n} real tokens")


def experience_difference(rollout: Any, record: IterationRecord, rtol: float) -> str | None:
    """The first experience tensor of `rollout` that differs from `record`'s, where, and the likely
    cause."""
    for name, tensor in (("sequences", rollout.sequences), ("mask", rollout.mask)):
        mine = getattr(record, name)
        same_shape = tuple(tensor.shape) == tuple(mine.shape)
        if not same_shape or not torch.equal(tensor.detach().cpu().to(mine.dtype), mine):
            return (f"your {name} differ from the sampled batch's: sample first, with the call "
                    "given (at config.temperature), keep the samples' mask, and draw no random "
                    "numbers before it")
    real = record.mask.bool()  # (B, R)
    for name in EXPERIENCE:
        got, expected = getattr(rollout, name).detach().float().cpu(), record.experience[name]
        if got.shape != expected.shape:
            return f"your {name} have shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        per_token = got.dim() == 2  # (B, R); the scores are (B,)
        on_real = expected[real] if per_token else expected
        apart = far(got, expected, rtol, float(on_real.abs().max())) & (real if per_token else True)
        if bool(apart.any()):
            first = apart.nonzero()[0]
            i, t = (int(first[0]), int(first[1])) if per_token else (int(first[0]), 0)
            at = _where(record.mask, i, t) if per_token else f"row {i}"
            return (
                f"your {name} differ first at {at}: got "
                f"{float(got[i, t] if per_token else got[i]):.5f}, expected "
                f"{float(expected[i, t] if per_token else expected[i]):.5f}. Likely cause: "
                + experience_hint(name, got, record, i, t))
    return None


def first_difference(got: IterationRecord, expected: IterationRecord, config: PPOConfig,
                     rtol: float) -> str | None:
    """The first difference between a learner's iteration (`got`) and the library's (`expected`), in
    the order the iteration makes things (experience, losses, steps and updates), with the likely
    cause; None if none.

    `rtol` is one forward pass's rounding budget (`rounding_rtol`): the experience gets one; what
    follows k optimiser steps gets k + 1, since each step moves the two runs' weights apart by its
    own rounding."""
    problem = experience_difference(got.rollout, expected, rtol)
    if problem is not None:
        return problem
    if got.losses.shape != expected.losses.shape:
        return (f"you returned {len(got.losses)} (policy loss, value loss) pairs, expected "
                f"{len(expected.losses)}: one per minibatch, {config.ppo_epochs} epochs of "
                f"{len(expected.losses) // config.ppo_epochs}")
    per_epoch = -(-len(expected.mask) // config.mini_batch_size)
    for k in range(len(expected.losses)):
        for column, role in enumerate(("policy", "value")):
            g, e = float(got.losses[k, column]), float(expected.losses[k, column])
            scale = float(expected.losses[:, column].abs().max())  # the column's largest loss
            # minibatch k runs on weights that k steps have moved: a rounding budget for each
            budget = (k + 1) * rtol
            if not bool(far(got.losses[k, column], expected.losses[k, column], budget, scale)):
                continue
            epoch, index = divmod(k, per_epoch)
            return (f"your {role} losses match up to minibatch {k} (epoch {epoch}, #{index}) and "
                    f"differ there: got {g:.6f}, expected {e:.6f}. Likely cause: "
                    + loss_hint(role, k, got, expected, config, rtol))
    for role in ("policy", "value"):
        step = step_hint(role, got, expected, len(expected.losses) + 1, config, rtol)
        if step is not None:
            return f"every loss matches, but {step}"
        for mine, theirs, size in zip(got.updates[role], expected.updates[role],
                                      expected.weight_sizes[role], strict=True):
            if bool(((mine.double() - theirs.double()).abs()
                     > _update_allowance(theirs, size, len(expected.losses), rtol)).any()):
                return (f"every loss matches, but the {role} adapter's weights after the update "
                        f"differ: the last minibatch's {role} step (backward, clip, "
                        f"{role}_opt.step()) moved them differently")
    return None


def _update_allowance(update: torch.Tensor, size: float, steps: int, rtol: float) -> float:
    """How far two runs' updates of one weight matrix may differ after `steps` optimiser steps."""
    # an update is w_after - w_before in float32 (adapters train in float32): each run's is off by
    # up to one unit in the last place of w, 2 u |w|, so two runs by 4 u |w| (u: the unit
    # roundoff); this floor decides for a matrix whose own change is tiny (LoRA A while B is still
    # near 0)
    floor = 4 * FLOAT32_UNIT_ROUNDOFF * (size + float(update.abs().max()))
    return (steps + 1) * rtol * max(float(update.abs().max()), 1e-12) + floor


def budget_used(got: IterationRecord, expected: IterationRecord, config: PPOConfig,
                rtol: float) -> float:
    """The largest share of its allowance that any difference `first_difference` compares takes:
    below 1, the check passes on the numbers (1 is the budget itself). The same allowances as
    `first_difference`: one budget for the experience, k + 1 for what follows k optimiser steps."""
    real = expected.mask.bool()  # (B, R)
    shares = []
    for name in EXPERIENCE:
        mine, theirs = got.experience[name].double(), expected.experience[name].double()
        on_real = (real if theirs.dim() == 2 else torch.ones_like(theirs, dtype=torch.bool))
        scale = max(float(theirs[on_real].abs().max()), 1e-12)
        shares.append(float((mine - theirs)[on_real].abs().max()) / (rtol * scale))
    steps = len(expected.losses)
    for column in (0, 1):
        scale = max(float(expected.losses[:, column].abs().max()), 1e-12)
        shares += [abs(float(got.losses[k, column] - expected.losses[k, column]))
                   / ((k + 1) * rtol * scale) for k in range(steps)]
    for role in ("policy", "value"):
        theirs = expected.step_norms[role]
        shares += [abs(g - e) / ((j + 1) * rtol * max(theirs))
                   for j, (g, e) in enumerate(zip(got.step_norms[role], theirs, strict=True))]
        for mine, update, size in zip(got.updates[role], expected.updates[role],
                                      expected.weight_sizes[role], strict=True):
            shares.append(float((mine.double() - update.double()).abs().max())
                          / _update_allowance(update, size, steps, rtol))
    return max(shares)


class PassedCode:
    """The function objects a check passed with: a pass belongs to them, not to their names (a
    function redefined after its check is another function, checked again before it is used)."""

    def __init__(self) -> None:
        self.functions: dict[str, Any] = {}  #: name -> the function object that passed

    def record(self, **functions: Any) -> None:
        """Record that the check passed with these functions (unwrapped from the check's in-place
        guard)."""
        self.functions = {name: inspect.unwrap(fn) for name, fn in functions.items()}

    def holds_for(self, **functions: Any) -> bool:
        """True when the check passed with exactly these function objects."""
        return bool(self.functions) and self.functions.keys() == functions.keys() and all(
            self.functions[name] is inspect.unwrap(fn) for name, fn in functions.items())
