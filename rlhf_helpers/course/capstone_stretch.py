"""Notebook 08's stretch goal: an iteration that stops early on approx-KL, checked against the
library's iteration run for exactly the epochs the rule keeps.

    case = kl_stop_case(model, tok, prompts, config, seeds, lrs)   # stop_kl, and the library's run
    got = run_iteration(functools.partial(ppo_iteration_kl_stop, stop_kl=case.stop_kl), ...)
    problem = kl_stop_difference(got, case, rtol)                  # None, or what differs and why

The rule is CleanRL's `target_kl`: after each epoch, when the approx-KL (k3, the masked mean of
(rho - 1) - log rho) of that epoch's last minibatch exceeds the threshold, no further epoch runs.
The library has no such option (its `PPOConfig.target_kl` is the adaptive KL controller's target),
but the rule only decides how many epochs run, and `ppo_epochs` is the library's option for that:
the same batch, shuffles and steps, cut after the kept epochs. `kl_stop_case` runs the library's
iteration with every epoch, reads the approx-KL it logs for each minibatch, and sets the threshold
between two epochs' values (`stop_rule`), so that the rule keeps a definite number of epochs, fewer
than all.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlhf_helpers.course.capstone import first_difference
from rlhf_helpers.course.capstone_run import IterationRecord, library_iteration, run_iteration
from rlhf_helpers.course.capstone_state import ModelSnapshot
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: the least ratio between the approx-KL that stops the rule after a later epoch and the largest one
#: before it: the threshold, set halfway (geometrically), then stands clear of both by far more than
#: rounding
MIN_KL_GAP = 1.2


@dataclass(frozen=True)
class KLStopCase:
    """The stretch check's case: its threshold, and the library's iteration for the kept epochs."""

    stop_kl: float  #: the threshold on the approx-KL of an epoch's last minibatch
    #: the library's approx-KL on the last minibatch of each epoch, every epoch run
    end_kls: tuple[float, ...]
    epochs_kept: int  #: the epochs the rule runs (fewer than config.ppo_epochs)
    config: PPOConfig  #: the check's settings, ppo_epochs = epochs_kept
    expected: IterationRecord  #: the library's iteration under `config`
    full_epochs: int  #: the epochs without the rule


def stop_rule(end_kls: Sequence[float]) -> tuple[int, float]:
    """(the epoch after which the rule stops, counted from 0; the threshold) for these end-of-epoch
    approx-KLs: the epoch e > 0, not the last, whose value stands furthest above every earlier one,
    the threshold halfway between (geometrically); when none stands MIN_KL_GAP above, the first
    epoch, at half its value. Either way every value stands clear of the threshold."""
    if len(end_kls) < 2:
        raise ValueError(f"an early stop needs at least 2 epochs, got {len(end_kls)}")
    gaps = {e: end_kls[e] / max(max(end_kls[:e]), 1e-12) for e in range(1, len(end_kls) - 1)}
    stop_at = max(gaps, key=gaps.__getitem__, default=None)
    if stop_at is None or gaps[stop_at] < MIN_KL_GAP:
        return 0, end_kls[0] / 2
    return stop_at, math.sqrt(end_kls[stop_at] * max(end_kls[:stop_at]))


def kl_stop_case(model: Any, tokenizer: Any, prompts: Sequence[str], config: PPOConfig,
                 seeds: tuple[int, int], lrs: tuple[float, float],
                 start: ModelSnapshot | None = None) -> KLStopCase:
    """Run the library's iteration as `run_iteration` does (from `start`), every epoch
    (config.ppo_epochs >= 2), then for the epochs that `stop_rule`'s threshold keeps."""
    stats: list[dict[str, float]] = []
    run_iteration(functools.partial(library_iteration, stats=stats), model, tokenizer, prompts,
                  config, seeds, lrs, start)
    per_epoch = len(stats) // config.ppo_epochs
    ends = tuple(float(stats[(e + 1) * per_epoch - 1]["approx_kl"])
                 for e in range(config.ppo_epochs))
    stop_at, stop_kl = stop_rule(ends)
    kept = config.replace(ppo_epochs=stop_at + 1)
    expected = run_iteration(library_iteration, model, tokenizer, prompts, kept, seeds, lrs,
                             start)
    return KLStopCase(stop_kl, ends, stop_at + 1, kept, expected, config.ppo_epochs)


def kl_stop_difference(got: IterationRecord, case: KLStopCase, rtol: float) -> str | None:
    """The first difference between a learner's early-stopped iteration and the library's run for
    the kept epochs, with the likely cause; None if none."""
    n, want = len(got.losses), len(case.expected.losses)
    if n == want:
        return first_difference(got, case.expected, case.config, rtol)
    per_epoch = want // case.epochs_kept
    ends = ", ".join(f"{kl:.4f}" for kl in case.end_kls)
    head = (f"you took {n} minibatch steps, the rule {want}: the approx-KL of each epoch's last "
            f"minibatch is {ends} (the library's, every epoch run) against stop_kl "
            f"{case.stop_kl:.4f}, so the rule stops after epoch {case.epochs_kept - 1} (counting "
            "from 0). Likely cause: ")
    k3 = ("the approx-KL is k3, the masked mean over the minibatch's real tokens of (rho - 1) - "
          "log rho (notebook 04's approx_kl), from its forward pass before its step")
    if n == per_epoch * case.full_epochs:
        return head + ("you never stopped: after each epoch, break out of the epoch loop when its "
                       "last minibatch's approx-KL exceeds stop_kl; if your loop does, its "
                       f"approx-KL never exceeded stop_kl: {k3}")
    if n % per_epoch:
        return head + ("you stopped inside an epoch: test the approx-KL once per epoch, after its "
                       "last minibatch (CleanRL's rule), not after every minibatch")
    return head + f"you stopped after another epoch: {k3}"
