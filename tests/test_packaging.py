"""The two install routes (pip via pyproject.toml, conda via environment.yml) must agree."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _env_pip_requirements() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    for dep in env["dependencies"]:
        if isinstance(dep, dict) and "pip" in dep:
            return dep["pip"]
    raise AssertionError("environment.yml has no pip section")


def test_environment_yml_names_the_same_packages_as_pyproject():
    project = _pyproject()["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["notebooks"]]
    listed = [Requirement(r) for r in _env_pip_requirements() if not r.startswith("-e")]
    assert {r.name: str(r.specifier) for r in listed} == {r.name: str(r.specifier) for r in wanted}


def test_environment_yml_installs_the_package_with_notebook_extras_on_python_311():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
    assert "-e .[notebooks]" in _env_pip_requirements()


def test_constraints_pin_every_direct_dependency_inside_its_range():
    project = _pyproject()["project"]
    direct = [Requirement(r) for r in project["dependencies"]]
    direct += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            pins[Requirement(m.group(1)).name.lower().replace("_", "-")] = m.group(2)
    for req in direct:
        key = req.name.lower().replace("_", "-")
        assert key in pins, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(pins[key], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[key]}, outside {req.specifier}"
        )
