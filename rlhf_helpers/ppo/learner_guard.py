"""What a learner's function may not leave behind: torch's global modes, put back after each call
and named when the call changed them.

    with learner_call_guard("gae_loop"):      # AssertionError naming what the call left changed
        advantages = gae_loop(rewards, values, mask)
    with global_modes_kept() as changed:      # the modes put back; `changed` says what had changed
        check()

A mode is process-wide: a function that calls `torch.set_grad_enabled(False)` or
`torch.set_default_dtype(torch.float64)` and returns changes every cell run after it (no gradient
for the next backward pass, float64 for every tensor made). Both blocks record the modes when they
start and, when they end (raised or not), put back each that changed. `guard_modes(function)` runs
every call of `function` in `learner_call_guard`: the exercise checks wrap the learner's function
with it (`course.exercise_checks`), and notebook 08's check runs each attempt in it
(`course.capstone_state`); the trainer refuses a piece that left
a mode changed (`ppo.piece_checks.call_piece`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


@dataclass(frozen=True)
class GlobalModes:
    """torch's process-wide modes that a function can change and leave changed."""

    grad_enabled: bool  #: torch.is_grad_enabled()
    default_dtype: torch.dtype  #: torch.get_default_dtype()
    default_device: torch.device  #: torch.get_default_device()
    anomaly: bool  #: torch.is_anomaly_enabled()
    deterministic: bool  #: torch.are_deterministic_algorithms_enabled()
    deterministic_warn_only: bool  #: torch.is_deterministic_algorithms_warn_only_enabled()


def global_modes() -> GlobalModes:
    """torch's global modes now."""
    return GlobalModes(torch.is_grad_enabled(), torch.get_default_dtype(),
                       torch.get_default_device(), torch.is_anomaly_enabled(),
                       torch.are_deterministic_algorithms_enabled(),
                       torch.is_deterministic_algorithms_warn_only_enabled())


def set_global_modes(modes: GlobalModes) -> None:
    """Make torch's global modes `modes` (each set only where it differs, so nothing is touched when
    none changed)."""
    now = global_modes()
    if now.grad_enabled != modes.grad_enabled:
        torch.set_grad_enabled(modes.grad_enabled)
    if now.default_dtype != modes.default_dtype:
        torch.set_default_dtype(modes.default_dtype)
    if now.default_device != modes.default_device:
        # None drops the device mode torch installs: the state of a process that never set one
        cpu = modes.default_device == torch.device("cpu")
        torch.set_default_device(None if cpu else modes.default_device)
    if now.anomaly != modes.anomaly:
        torch.set_anomaly_enabled(modes.anomaly)
    if (now.deterministic, now.deterministic_warn_only) != (modes.deterministic,
                                                             modes.deterministic_warn_only):
        torch.use_deterministic_algorithms(modes.deterministic,
                                           warn_only=modes.deterministic_warn_only)


class ModeChange(NamedTuple):
    """One global mode a call left changed: the state it left, and how a learner avoids it."""

    what: str  #: e.g. "autograd off (torch.set_grad_enabled(False))"
    fix: str  #: e.g. "use `with torch.no_grad():` around the lines that need no gradient"


def mode_changes(before: GlobalModes, after: GlobalModes) -> list[ModeChange]:
    """What changed from `before` to `after`: the state left behind, with the call that makes it."""
    changes = []
    if before.grad_enabled != after.grad_enabled:
        changes.append(ModeChange(
            f"autograd {'on' if after.grad_enabled else 'off'} "
            f"(torch.set_grad_enabled({after.grad_enabled}))",
            "use `with torch.no_grad():` around the lines that need no gradient"))
    if before.default_dtype != after.default_dtype:
        dtype = str(after.default_dtype).removeprefix("torch.")
        changes.append(ModeChange(f"the default dtype {dtype} (torch.set_default_dtype)",
                                  "pass `dtype=` where a tensor is made"))
    if before.default_device != after.default_device:
        changes.append(ModeChange(
            f"the default device {after.default_device} (torch.set_default_device)",
            "pass `device=` where a tensor is made"))
    if before.anomaly != after.anomaly:
        changes.append(ModeChange(f"anomaly detection {'on' if after.anomaly else 'off'} "
                                  "(torch.autograd.set_detect_anomaly)",
                                  "use `with torch.autograd.detect_anomaly():` around the lines"))
    if (before.deterministic, before.deterministic_warn_only) != (after.deterministic,
                                                                   after.deterministic_warn_only):
        state = "on" if after.deterministic else "off"
        changes.append(ModeChange(
            f"deterministic algorithms {state} (torch.use_deterministic_algorithms)",
            "set it back before returning"))
    return changes


@contextmanager
def global_modes_kept() -> Iterator[list[ModeChange]]:
    """Put torch's global modes back as they were when the block started, however it ends; the list
    it gives gets what the block had changed (empty: nothing)."""
    before = global_modes()
    changed: list[ModeChange] = []
    try:
        yield changed
    finally:
        changed.extend(mode_changes(before, global_modes()))
        set_global_modes(before)


def modes_changed_message(name: str, changes: list[ModeChange]) -> str:
    """One line for a learner: what their function `name` left changed, and how to avoid it."""
    fixes = list(dict.fromkeys(change.fix for change in changes))  # each once, in order
    return (f"{name} left {' and '.join(change.what for change in changes)} for the code after it "
            f"(put back now): instead, {'; '.join(fixes)}")


@contextmanager
def learner_call_guard(name: str) -> Iterator[None]:
    """Run a call of the learner's function `name` with torch's global modes put back after it,
    however it ends; AssertionError (`modes_changed_message`) when it changed one. When the call
    raised too, the message names the change first (often the cause: no gradient, then a backward
    pass that fails) and the error after it."""
    try:
        with global_modes_kept() as changed:
            yield
    except Exception as error:
        if not changed:
            raise
        first = (str(error).splitlines() or [""])[0]
        raise AssertionError(f"{modes_changed_message(name, changed)}; then it raised "
                             f"{type(error).__name__}: {first}") from error
    if changed:
        raise AssertionError(modes_changed_message(name, changed))


def guard_modes(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, every call of it run in `learner_call_guard`."""
    name = getattr(function, "__name__", "your function")

    def guarded(*args: Any, **kwargs: Any) -> Any:
        with learner_call_guard(name):
            return function(*args, **kwargs)

    guarded.__name__ = guarded.__qualname__ = name
    guarded.__wrapped__ = function  # type: ignore[attr-defined]
    return guarded
