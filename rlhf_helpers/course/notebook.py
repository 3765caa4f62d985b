"""The standard notebook header: Colab badge, Colab-only install cell, versions, profile and device.

Every course notebook starts with the same three pieces (see notebooks/CONVENTIONS.md):

1. a markdown cell with the title, the learning goals and an "Open in Colab" badge whose link is
   `colab_url(<this notebook's file name>)`;
2. a code cell whose source is exactly `colab_setup_source()`: on Colab it clones the course at
   `INSTALL_REF` and installs it, every package Colab ships held at its version except those in
   `COLAB_UPGRADES` (see `rlhf_helpers.course.colab_setup`); anywhere else it does nothing;
3. a code cell that calls `show_environment()`: package versions, the profile and the device in use.

The notebooks import their exercise checks from here too (`exercise_check`, `exercise_outcome`,
`learner_pieces`, ...): they live in `rlhf_helpers.course.exercise_checks`.

The repository slug, the badge ref and the install ref live here and nowhere else: the notebook
generator (tools/build_notebooks.py) writes them into the notebooks and tests/package/test_links.py
reads them back. This module imports only the standard library at import time, so the header cell is
fast.
"""

from __future__ import annotations

import importlib
import platform
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from rlhf_helpers import __version__
from rlhf_helpers.course.exercise_checks import (
    CHECK_SECONDS,
    EXERCISE_FAILED,
    EXERCISE_PASSED,
    EXERCISE_TODO,
    checked_function_is,
    exercise_check,
    exercise_outcome,
    learner_pieces,
    trust_learner_function,
)

__all__ = [
    "REPO_SLUG", "BADGE_REF", "INSTALL_REF", "NOTEBOOK_DIR", "COLAB_CLONE_DIR", "COLAB_UPGRADES",
    "VERSION_PACKAGES", "in_colab", "repo_url", "colab_url", "colab_badge", "colab_setup_source",
    "package_versions", "Environment", "show_environment",
    # the exercise checks (course.exercise_checks), imported by the notebooks from here
    "CHECK_SECONDS", "EXERCISE_PASSED", "EXERCISE_FAILED", "EXERCISE_TODO", "exercise_check",
    "exercise_outcome", "checked_function_is", "trust_learner_function", "learner_pieces",
]

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
    """Source of the set-up cell: a Colab form (its code hidden there) with one drop-down, the
    profile (`auto`: gpu where CUDA is present, else tiny). On Colab it clones the course, runs
    `rlhf_helpers.course.colab_setup.install_course` from the clone, then
    `rlhf_helpers.course.profile_choice.choose_profile`, which sets the profile and says what it
    means for the text's numbers; anywhere else it does nothing ($RLHF_PROFILE chooses there).

    `install_course` uses the standard library only, so it can be imported from the clone before the
    course is installed. It keeps every package Colab ships at its version except COLAB_UPGRADES.
    """
    upgrade = (", ".join(f'"{name}"' for name in COLAB_UPGRADES)
               + ("," if len(COLAB_UPGRADES) == 1 else ""))
    clone, ref, url = COLAB_CLONE_DIR, INSTALL_REF, repo_url()
    # a backslash at the end of a line joins the next one to it: the cell's long lines
    return f"""\
#@title Set up the course (Colab only; anywhere else this cell does nothing) \
{{ display-mode: "form" }}
import sys

#@markdown **Profile**: auto is gpu with a GPU attached, else tiny (the text states its numbers).
PROFILE = "auto"  #@param ["auto", "tiny", "gpu"]
if "google.colab" in sys.modules:  # clone the branch the badge opened; install it, \
keeping Colab's packages
    import os
    import subprocess

    REPO, REF, CLONE = "{url}", "{ref}", "{clone}"
    if not os.path.isdir(CLONE):
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", REF, REPO, CLONE], \
check=True)
    sys.path.insert(0, CLONE)
    from rlhf_helpers.course.colab_setup import install_course  # standard library only

    for name, (old, new) in install_course(REPO, REF, CLONE, upgrade=({upgrade})).items():
        print(f"{{name}}: {{old or 'not installed'}} -> {{new}}")
    from rlhf_helpers.course.profile_choice import choose_profile

    choose_profile(PROFILE)"""


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
