"""The standard notebook header: Colab badge, Colab-only install cell, versions, profile and device.

Every course notebook starts with the same three pieces (see notebooks/CONVENTIONS.md):

1. a markdown cell with the title, the learning goals and an "Open in Colab" badge whose link is
   `colab_url(<this notebook's file name>)`;
2. a code cell whose source is exactly `colab_setup_source()`: on Colab it clones the course at
   `INSTALL_REF` and installs it, every package Colab ships held at its version except those in
   `COLAB_UPGRADES` (see `rlhf_helpers.course.colab_setup`); anywhere else it does nothing;
3. a code cell that calls `show_environment()`: package versions, the profile and the device in use.

The repository slug, the badge ref and the install ref live here and nowhere else: the notebook
generator (tools/build_notebooks.py) writes them into the notebooks and tests/package/test_links.py
reads them back. This module imports only the standard library at import time, so the header cell is
fast.
"""

from __future__ import annotations

import importlib
import io
import platform
import re
import sys
import types
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rlhf_helpers import __version__
from rlhf_helpers.core.printed import wrap_printed
from rlhf_helpers.course.exercises import (
    guard_in_place,
    hidden_from_learner,
    same_function,
    time_limit,
)

#: GitHub "owner/name" of the course repository.
REPO_SLUG = "rlhf-course/rlhf-ppo-course"
#: Branch the "Open in Colab" badges open.
BADGE_REF = "main"
#: Branch the Colab set-up cell installs: the one the badge opened, so notebook and code match.
INSTALL_REF = BADGE_REF
#: Folder of the notebooks inside the repository.
NOTEBOOK_DIR = "notebooks"
#: Where the Colab set-up cell clones the course (it keeps data/ next to the package).
COLAB_CLONE_DIR = "/content/rlhf-ppo-course"
#: Packages Colab ships that the set-up cell must upgrade, and why (every other one keeps its
#: version).
COLAB_UPGRADES = {
    "datasets": "Colab has 4.0.0; trl 1.16 requires datasets>=4.7.0",
    "pyarrow": "Colab has 18.1.0; trl 1.16 and datasets>=4.7 require pyarrow>=21.0.0",
}
#: Packages whose versions the header prints, in this order.
VERSION_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "trl",
    "plotly",
    "ipywidgets",
    "rlhf_helpers",
)


def in_colab() -> bool:
    """True inside a Google Colab kernel (its `google.colab` module is already imported there)."""
    return "google.colab" in sys.modules


def repo_url() -> str:
    """HTTPS URL of the course repository."""
    return f"https://github.com/{REPO_SLUG}"


def colab_url(notebook: str, ref: str = BADGE_REF) -> str:
    """The Colab link that opens `notebooks/<notebook>` of the repository at `ref`."""
    if not notebook.endswith(".ipynb") or "/" in notebook:
        raise ValueError(f"notebook must be a bare file name ending in .ipynb, got {notebook!r}")
    return (
        f"https://colab.research.google.com/github/{REPO_SLUG}/blob/{ref}/{NOTEBOOK_DIR}/{notebook}")


def colab_badge(notebook: str) -> str:
    """Markdown for the "Open in Colab" link of `notebooks/<notebook>`: a text link, not Colab's
    badge image, so that it reads the same offline, where the image cannot load."""
    return f"**[Open in Colab \u2197]({colab_url(notebook)})**"


def colab_setup_source() -> str:
    """Source of the set-up cell: a Colab form (its code hidden there) that clones the course and
    runs `rlhf_helpers.course.colab_setup.install_course` from the clone; anywhere else it does
    nothing.

    `install_course` uses the standard library only, so it can be imported from the clone before the
    course is installed. It keeps every package Colab ships at its version except COLAB_UPGRADES.
    """
    upgrade = (", ".join(f'"{name}"' for name in COLAB_UPGRADES)
               + ("," if len(COLAB_UPGRADES) == 1 else ""))
    clone, ref, url = COLAB_CLONE_DIR, INSTALL_REF, repo_url()
    return f"""\
#@title Set up the course (Colab only; anywhere else this cell does nothing) {{ display-mode: "form" }}
import sys

if "google.colab" in sys.modules:  # clone the branch the badge opened; install it, keeping Colab's packages
    import os
    import subprocess

    REPO, REF, CLONE = "{url}", "{ref}", "{clone}"
    if not os.path.isdir(CLONE):
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", REF, REPO, CLONE], check=True)
    sys.path.insert(0, CLONE)
    from rlhf_helpers.course.colab_setup import install_course  # standard library only

    for name, (old, new) in install_course(REPO, REF, CLONE, upgrade=({upgrade})).items():
        print(f"{{name}}: {{old or 'not installed'}} -> {{new}}")"""


def package_versions(packages: tuple[str, ...] = VERSION_PACKAGES) -> dict[str, str]:
    """Installed version of each package ("not installed" when missing), plus Python's."""
    versions = {"python": platform.python_version()}
    for name in packages:
        if name == "rlhf_helpers":
            versions[name] = __version__
            continue
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@dataclass(frozen=True)
class Environment:
    """What the header cell reports about the running kernel."""

    #: Package name -> installed version.
    versions: dict[str, str]
    #: Name of the active profile ("tiny", "gpu"), or "unknown" if profiles are unavailable.
    profile: str
    #: Device the profile runs on, e.g. "cpu" or "cuda".
    device: str
    #: True inside Google Colab.
    colab: bool
    #: Compute dtype of the profile ("float32", "bfloat16", "float16"), or "unknown".
    dtype: str = "unknown"
    #: The dtype and why it fits the device, e.g. "float16 (Tesla T4, compute capability 7.5: no
    #: bf16 in hardware)".
    dtype_reason: str = "unknown"
    #: Where the profile's weights come from, in words (`runtime.weights.describe_weights`), or
    #: "unknown".
    weights: str = "unknown"


def _dtype_and_reason() -> tuple[str, str]:
    """The active profile's compute dtype and `precision.describe_dtype`'s line for it ("unknown" on
    failure)."""
    try:
        profile = importlib.import_module("rlhf_helpers.runtime.profiles").get_profile()
        precision = importlib.import_module("rlhf_helpers.runtime.precision")
        dtype = precision.resolve_dtype(profile.dtype, profile.device)
        return dtype, precision.describe_dtype(dtype, profile.device)
    except (ImportError, AttributeError):
        return "unknown", "unknown"


def _profile_and_device() -> tuple[str, str, str]:
    """Name, device and weights (in words) of `rlhf_helpers.runtime.profiles.get_profile()`, guarded
    for older checkouts."""
    try:
        profiles = importlib.import_module("rlhf_helpers.runtime.profiles")
        weights = importlib.import_module("rlhf_helpers.runtime.weights")
        profile = profiles.get_profile()
    except (ImportError, AttributeError):
        profile = None
    if profile is not None:
        name = str(getattr(profile, "name", "unknown"))
        device = str(getattr(profile, "device", "cpu"))
        where = weights.describe_weights(getattr(profile, "weights", "auto"),
                                         getattr(profile, "base_model", ""))
        return name, device, where
    import torch  # only here: the header's own import stays light

    return "unknown", "cuda" if torch.cuda.is_available() else "cpu", "unknown"


def show_environment(print_table: bool = True) -> Environment:
    """Print the versions table, the profile/device line and the dtype line (the dtype and why it
    fits the device); make the course's plotly template the default; return them as an
    `Environment`."""
    profile, device, weights = _profile_and_device()
    dtype, dtype_reason = _dtype_and_reason()
    try:  # one figure style for every notebook (plotly and ipywidgets come with the notebook extra)
        importlib.import_module("rlhf_helpers.widgets.style").use_course_figure_style()
    except ImportError:
        pass
    env = Environment(versions=package_versions(), profile=profile, device=device, colab=in_colab(),
                      dtype=dtype, dtype_reason=dtype_reason, weights=weights)
    if print_table:
        width = max(len(name) for name in env.versions)
        for name, ver in env.versions.items():
            print(f"{name:<{width}}  {ver}")
        where = "Colab" if env.colab else "local"
        print(f"profile: {env.profile}   device: {env.device}   ({where})")
        print(f"dtype: {env.dtype_reason}")
        print(f"weights: {env.weights}")
    return env


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
    changes a tensor it was given in place (`course.exercises.guard_in_place`)."""
    function = _learner_function(name, namespace)
    if function is None:
        yield
        return
    key = _LEARNER_NAME.search(name).group(1)
    guarded = guard_in_place(function)
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
    changes a tensor it was given in place, and a check running past `seconds` stops with FAILED (an
    endless loop). The check and the function it ran are recorded: `trust_learner_function` trusts
    that function only (`checked_function_is`), and checks a function redefined after it again.
    Returns None, so the cell shows only that line.
    """
    namespace = getattr(check, "__globals__", None)
    _CHECKED[name] = _Checked(check, tuple(hidden), seconds, _learner_function(name, namespace))
    try:
        with hidden_from_learner(hidden,
                                 namespace), _guarded_learner(name, namespace), time_limit(seconds):
            check()
    except NotImplementedError:
        _OUTCOMES[name] = EXERCISE_TODO
        print(f"{EXERCISE_TODO}  {name}: the stub still raises NotImplementedError; "
              "fill it in, or open the solution below.")
        return
    except Exception as error:  # the learner's code may fail in any way: report, don't crash
        _OUTCOMES[name] = EXERCISE_FAILED
        first, *rest = str(error).splitlines() or [""]
        print(f"{EXERCISE_FAILED}  {name}: {type(error).__name__}: {first}")
        for line in rest:  # e.g. assert_close's mismatch report
            print(f"    {line}")
        return
    _OUTCOMES[name] = EXERCISE_PASSED
    print(f"{EXERCISE_PASSED}  {name}")


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
    pieces, why, names = {}, {}, {arg: _LEARNER_NAME.search(name).group(1) for arg,
                                  name in exercises.items()}
    for arg, name in exercises.items():
        function = _learner_function(name, namespace)
        trusted, why[arg] = (trust_learner_function(name, function) if function
                             else (False, "it is not defined"))
        if trusted and arg in (refused or {}):
            trusted, why[arg] = False, refused[arg]
        if trusted:
            pieces[arg] = function
    line = "This run trains with your " + (", ".join(names[arg] for arg in pieces)
                                           or "code in no piece yet")
    library = [names[arg] for arg in exercises if arg not in pieces]
    lines = [line + (", and with the library's " + ", ".join(library) if library else "") + "."]
    side = {arg: "yours" if arg in pieces else "the library's" for arg in exercises}
    lines += [f"  {names[arg]}: {side[arg]}, because {why[arg]}"
              for arg in exercises if arg not in pieces or why[arg] != "its check passed"]
    # continuations four spaces in: under the first line they stay apart from the two-space reasons
    return pieces, wrap_printed("\n".join(lines), indent=" " * 4).split("\n")
