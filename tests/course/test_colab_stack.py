"""The Colab set-up cell, run for real in an environment with Colab's versions (`make test-colab`).

`make test-colab` builds .venv-colab from tests/colab_stack.txt (Python 3.13) and runs this file
with that venv's Python first: the set-up cell's `install_course` installs the course there from a
local git repository (a file URL in place of GitHub), and the tests check that no package Colab
ships changed version except those named in COLAB_UPGRADES, and that pyproject's lower bounds are
what this environment runs. Then it runs the notebooks there. In any other environment these tests
skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rlhf_helpers.course.colab_setup import install_course
from rlhf_helpers.course.notebook import COLAB_UPGRADES, INSTALL_REF

ROOT = Path(__file__).resolve().parents[2]
STACK_FILE = ROOT / "tests" / "colab_stack.txt"
#: Set by `make test-colab` (the Makefile's COLAB_VENV), so nothing here runs in the main venv.
IN_COLAB_STACK = os.environ.get("RLHF_COLAB_STACK") == "1"

pytestmark = pytest.mark.skipif(not IN_COLAB_STACK, reason="runs in `make test-colab` only")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _freeze() -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True,
                         text=True, check=True).stdout
    pins = [re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line) for line in out.splitlines()]
    return {_key(pin[1]): pin[2] for pin in pins if pin}


def _stack() -> dict[str, str]:
    pins = [re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
            for line in STACK_FILE.read_text().splitlines()]
    return {_key(pin[1]): pin[2] for pin in pins if pin}


def _local_repository(tmp_path: Path) -> str:
    """A git repository holding this checkout's package files on branch INSTALL_REF; its file
    URL."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "rlhf_helpers", repo / "rlhf_helpers",
                    ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    subprocess.run([*git, "init", "--quiet", "--initial-branch", INSTALL_REF], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "course"], check=True)
    return repo.as_uri()


def test_this_environment_has_colab_versions():
    assert sys.version_info[:2] == (3, 13), f"Colab runs Python 3.13, this is {sys.version}"
    installed, upgraded = _freeze(), {_key(name) for name in COLAB_UPGRADES}
    wrong = {name: (pin, installed.get(name)) for name, pin in _stack().items()
             if name not in upgraded and installed.get(name) != pin}
    assert not wrong, f"not at Colab's version (pinned, installed): {wrong}"


def test_setup_cell_installs_the_course_and_changes_no_colab_package(tmp_path, capfd):
    url = _local_repository(tmp_path)
    before = _freeze()
    changed = install_course(url, INSTALL_REF, str(tmp_path / "clone"),
                             upgrade=tuple(COLAB_UPGRADES))
    after = _freeze()
    output = capfd.readouterr()
    diff = {name: (before.get(name), after.get(name)) for name in before.keys() | after.keys()
            if before.get(name) != after.get(name)}
    assert changed == diff  # the cell reports exactly what changed
    moved = {name for name, (old, new) in diff.items() if old is not None}
    assert moved <= {_key(name) for name in COLAB_UPGRADES}, f"Colab packages changed: {diff}"
    assert "trl" in after and (tmp_path / "clone" / "pyproject.toml").is_file()
    noise = output.out + output.err
    assert "Deprecat" not in noise and "license" not in noise.lower(), noise[-2000:]


def test_lower_bounds_are_the_versions_this_environment_runs():
    """Colab's stack is the low end of every range: each base dependency's '>=' is its version
    here."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    installed = _freeze()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in map(Requirement, project["dependencies"]):
        low = [Version(spec.version) for spec in req.specifier if spec.operator == ">="]
        assert low == [Version(installed[_key(req.name)])], f"{req}: this environment has " \
            f"{req.name}=={installed[_key(req.name)]}"


def test_notebook_kernels_run_in_this_environment(tmp_path):
    """nbclient's "python3" kernel must be this venv's Python, not another one on the machine."""
    import nbformat

    from rlhf_helpers.course.run_course import execute_notebook

    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import sys; print(sys.prefix)")])
    path = tmp_path / "where.ipynb"
    nbformat.write(nb, path)
    executed = execute_notebook(path, timeout=120, workdir=tmp_path)
    assert executed.cells[0].outputs[0]["text"].strip() == sys.prefix
