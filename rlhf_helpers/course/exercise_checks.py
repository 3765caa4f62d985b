"""The notebooks' exercise checks: run an exercise's check, print one line on how it went, and
remember what it ran, so a notebook trains with a learner's function only where its check passed.

    exercise_check("Exercise 2 (gae_loop)", check_gae_loop, hidden=[compute_gae])  # PASSED ...
    trusted, why = trust_learner_function("Exercise 2 (gae_loop)", gae_loop)
    pieces, lines = learner_pieces({"advantages": "Exercise 2 (gae_loop)"}, globals())

While a check runs, the library functions it hides refuse to run, the learner's function fails when
it changes a tensor it was given in place or leaves one of torch's global modes changed (autograd
off, a float64 default dtype: `ppo.learner_guard`), and a check past its time limit stops
(`course.exercises`). Whatever the check ran, torch's global modes are as before it when it ends, so
the next cell is not poisoned. The notebooks import these names from `course.notebook`, the header
module.
"""

from __future__ import annotations

import io
import re
import types
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from typing import Any

from rlhf_helpers.core.printed import wrap_printed
from rlhf_helpers.course.exercises import (
    guard_in_place,
    hidden_from_learner,
    same_function,
    time_limit,
)
from rlhf_helpers.ppo.learner_guard import global_modes_kept, guard_modes

#: First words of the line `exercise_check` prints for a passed, failed and unattempted exercise.
EXERCISE_PASSED, EXERCISE_FAILED, EXERCISE_TODO = "PASSED", "FAILED", "NOT DONE"
#: how the latest check of each exercise went in this kernel, by the name given to `exercise_check`
_OUTCOMES: dict[str, str] = {}


@dataclass(frozen=True)
class _Checked:
    """The latest check of one exercise: how to run it again, and the learner's function it ran."""

    check: Callable[[], None]
    hidden: tuple[Any, ...]
    seconds: float | None
    #: the function named in brackets in the exercise's name, as the check found it (None: no such
    #: function)
    function: Any


#: the latest check of each exercise in this kernel, by the name given to `exercise_check`
_CHECKED: dict[str, _Checked] = {}


def exercise_outcome(name: str) -> str | None:
    """EXERCISE_PASSED, EXERCISE_FAILED or EXERCISE_TODO: the latest check of `name` in this kernel
    (None: never checked). A notebook uses a learner's function only where its check passed."""
    return _OUTCOMES.get(name)


#: seconds an exercise's check may run before it stops with FAILED (the slowest, 05's ppo_update,
#: takes a few)
CHECK_SECONDS = 120.0
_LEARNER_NAME = re.compile(r"\((\w+)\)\s*$")  # "Exercise 2 (gae_loop)" -> gae_loop


def _learner_function(name: str,
                      namespace: MutableMapping[str, Any] | None) -> types.FunctionType | None:
    """The function an exercise's name names in brackets, as the namespace holds it now (None: there
    is none)."""
    match = _LEARNER_NAME.search(name)
    function = namespace.get(match.group(1)) if match and namespace is not None else None
    return function if isinstance(function, types.FunctionType) else None


def checked_function_is(name: str, function: Any) -> bool:
    """Whether the latest check of exercise `name` ran `function` (or a function with equal code): a
    pass recorded for one function says nothing about a function defined after it."""
    record = _CHECKED.get(name)
    return (record is not None and record.function is not None
            and same_function(record.function, function))


def trust_learner_function(name: str, function: Any) -> tuple[bool, str]:
    """Whether a notebook may use the learner's `function` for exercise `name`, and why, in a few
    words.

    A function is trusted when the latest check of `name` ran it (`checked_function_is`) and passed.
    One defined after its check is checked again here, quietly (its line is not printed): it is
    trusted when that check passes. Never raises."""
    record = _CHECKED.get(name)
    if record is None:
        return False, "its check has not run"
    if not checked_function_is(name, function):
        with redirect_stdout(io.StringIO()) as said:
            exercise_check(name, record.check, record.hidden, record.seconds)
        if _OUTCOMES.get(name) == EXERCISE_PASSED and checked_function_is(name, function):
            return True, "it was redefined after its check; checked again now, it passes"
        # "FAILED  Exercise 4 (ppo_update): why"
        first = (said.getvalue().strip().splitlines() or [""])[0]
        return False, f"it was redefined after its check; checked again now: {first}"
    outcome = _OUTCOMES.get(name)
    if outcome == EXERCISE_PASSED:
        return True, "its check passed"
    return False, "its check is not done yet" if outcome == EXERCISE_TODO else "its check failed"


@contextmanager
def _guarded_learner(name: str, namespace: MutableMapping[str, Any] | None) -> Iterator[None]:
    """While the check runs, the function the exercise names (in its namespace) fails when it
    changes a tensor it was given in place (`course.exercises.guard_in_place`) or leaves one of
    torch's global modes changed (`ppo.learner_guard.guard_modes`, which puts it back)."""
    function = _learner_function(name, namespace)
    if function is None:
        yield
        return
    key = _LEARNER_NAME.search(name).group(1)
    guarded = guard_modes(guard_in_place(function))
    namespace[key] = guarded
    try:
        yield
    finally:
        if namespace.get(key) is guarded:
            namespace[key] = function


def exercise_check(name: str, check: Callable[[], None], hidden: Sequence[Any] = (),
                   seconds: float | None = CHECK_SECONDS) -> None:
    """Run an exercise's `check` and print one line saying how it went; never raises.

    `check` runs the learner's code and asserts on it. A stub that still raises
    NotImplementedError prints "NOT DONE", a failed assertion or any other error prints "FAILED"
    with the message, so a notebook with unsolved exercises still runs top to bottom.
    `hidden`: the library functions (or methods) the exercise teaches. While `check` runs they raise
    LibraryShortcut however they are reached (course.exercises), so calling them fails the check.
    The function named in brackets in `name` ("Exercise 2 (gae_loop)") fails the check when it
    changes a tensor it was given in place or leaves one of torch's global modes changed (autograd
    off, the default dtype float64: the message names it), and a check running past `seconds` stops
    with FAILED (an endless loop). torch's global modes are put back when the check ends, whatever
    it ran; a change that other code of the check left gets a line of its own under the first. The
    check and the function it ran are recorded: `trust_learner_function` trusts that function only
    (`checked_function_is`), and checks a function redefined after it again.
    Returns None, so the cell shows only what it printed.
    """
    namespace = getattr(check, "__globals__", None)
    _CHECKED[name] = _Checked(check, tuple(hidden), seconds, _learner_function(name, namespace))
    with global_modes_kept() as left_changed:  # code the check ran besides the named function
        outcome, lines = _run_check(name, check, hidden, namespace, seconds)
    _OUTCOMES[name] = outcome
    if left_changed:  # put back already: say so, so that the learner learns of it
        left = " and ".join(change.what for change in left_changed)
        lines.append(f"    and the code this check ran left {left}: put back now, so the next "
                     "cell runs as before")
    print("\n".join(lines))


def _run_check(name: str, check: Callable[[], None], hidden: Sequence[Any],
               namespace: MutableMapping[str, Any] | None,
               seconds: float | None) -> tuple[str, list[str]]:
    """Run `check` as `exercise_check` says; its outcome and the lines to print."""
    try:
        with (hidden_from_learner(hidden, namespace), _guarded_learner(name, namespace),
              time_limit(seconds)):
            check()
    except NotImplementedError:
        return EXERCISE_TODO, [f"{EXERCISE_TODO}  {name}: the stub still raises "
                               "NotImplementedError; fill it in, or open the solution below."]
    except Exception as error:  # the learner's code may fail in any way: report, don't crash
        first, *rest = str(error).splitlines() or [""]
        # the rest: e.g. assert_close's mismatch report
        return EXERCISE_FAILED, ([f"{EXERCISE_FAILED}  {name}: {type(error).__name__}: {first}"]
                                 + [f"    {line}" for line in rest])
    return EXERCISE_PASSED, [f"{EXERCISE_PASSED}  {name}"]


def learner_pieces(exercises: dict[str, str], namespace: MutableMapping[str, Any],
                   refused: dict[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The learner's functions a run may train with, looked up by name (a deep dive may define one,
    or not).

    `exercises`: keyword argument -> exercise name ("Exercise 2 (gae_loop)"); the function is the
    one `namespace` (the notebook's `globals()`) holds under the name in brackets, used when
    `trust_learner_function` trusts it and `refused` (argument -> reason) does not refuse it.
    Returns (argument -> function, for those used; the lines to print: "This run trains with your
    ..., and with the library's ...", then why for every piece whose reason is not simply that its
    check passed; a line longer than `PRINT_WIDTH` wrapped into several)."""
    names = {arg: _LEARNER_NAME.search(name).group(1) for arg, name in exercises.items()}
    pieces, why = {}, {}
    for arg, name in exercises.items():
        function = _learner_function(name, namespace)
        trusted, why[arg] = (trust_learner_function(name, function) if function
                             else (False, "it is not defined"))
        if trusted and arg in (refused or {}):
            trusted, why[arg] = False, refused[arg]
        if trusted:
            pieces[arg] = function
    yours = ", ".join(names[arg] for arg in pieces) or "code in no piece yet"
    line = "This run trains with your " + yours
    library = [names[arg] for arg in exercises if arg not in pieces]
    lines = [line + (", and with the library's " + ", ".join(library) if library else "") + "."]
    side = {arg: "yours" if arg in pieces else "the library's" for arg in exercises}
    lines += [f"  {names[arg]}: {side[arg]}, because {why[arg]}"
              for arg in exercises if arg not in pieces or why[arg] != "its check passed"]
    # continuations four spaces in: under the first line they stay apart from the two-space reasons
    return pieces, wrap_printed("\n".join(lines), indent=" " * 4).split("\n")
