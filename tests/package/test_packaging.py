"""The two install routes (pip via pyproject.toml, conda via environment.yml) must agree, and every
lower bound in pyproject.toml is a version the tests ran with (constraints.txt: `make test`;
tests/colab_stack.txt: `make test-colab`, Colab's versions)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from rlhf_helpers.course.notebook import COLAB_UPGRADES

ROOT = Path(__file__).resolve().parents[2]


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    """Normalised package name -> version of every `name==version` line of a pip requirements
    file."""
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line)
        if m:
            pins[_key(m.group(1))] = m.group(2)
    return pins


def _direct_requirements() -> list[Requirement]:
    project = _pyproject()["project"]
    direct = [Requirement(r) for r in project["dependencies"]]
    direct += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    return direct


def lower_bound(req: Requirement) -> Version:
    """The version of the requirement's `>=` clause (every dependency must have one)."""
    bounds = [Version(spec.version) for spec in req.specifier if spec.operator == ">="]
    assert len(bounds) == 1, f"{req}: needs exactly one '>=' lower bound"
    return bounds[0]


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
    wanted = [Requirement(r)
              for r in project["dependencies"] + project["optional-dependencies"]["notebooks"]]
    listed = [Requirement(r) for r in _env_pip_requirements() if not r.startswith("-e")]
    assert {r.name: str(r.specifier) for r in listed} == {r.name: str(r.specifier) for r in wanted}


def test_environment_yml_installs_the_package_with_notebook_extras_on_python_311():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
    assert "-e .[notebooks]" in _env_pip_requirements()


def test_constraints_pin_every_direct_dependency_inside_its_range():
    pins = _pins(ROOT / "constraints.txt")
    for req in _direct_requirements():
        key = _key(req.name)
        assert key in pins, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(pins[key], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[key]}, outside {req.specifier}"
        )


def test_each_lower_bound_is_the_lowest_version_the_tests_ran_with():
    """Colab's version where the Colab stack has the package, else the main environment's.

    The set-up cell upgrades the packages in COLAB_UPGRADES on Colab, so their tested low end is
    what it installs there: tests/course/test_colab_stack.py checks those bounds in that
    environment, and here they must exclude Colab's version (else the upgrade would be needless)."""
    main, colab = _pins(ROOT / "constraints.txt"), _pins(ROOT / "tests" / "colab_stack.txt")
    upgraded = {_key(name) for name in COLAB_UPGRADES}
    for req in _direct_requirements():
        key, low = _key(req.name), lower_bound(req)
        assert low <= Version(main[key]), f"{req}: above the main environment's {main[key]}"
        if key in upgraded:
            assert not req.specifier.contains(colab[key]), f"{req} admits Colab's {colab[key]}"
            continue
        tested = min(Version(v) for v in (main[key], colab.get(key, main[key])))
        assert low == tested, f"{req}: the lowest version tested is {tested}"


def test_the_colab_stack_satisfies_every_range_it_is_not_upgraded_for():
    colab, upgraded = _pins(ROOT / "tests" / "colab_stack.txt"), {_key(n) for n in COLAB_UPGRADES}
    assert {"torch", "transformers", "peft", "ipywidgets", "plotly"} <= colab.keys()
    for req in _direct_requirements():
        key = _key(req.name)
        if key in colab and key not in upgraded:
            assert req.specifier.contains(colab[key]), \
                f"Colab's {req.name}=={colab[key]} is outside {req}"


def test_lower_bound_reads_the_ge_clause():
    assert lower_bound(Requirement("torch>=2.11,<3")) == Version("2.11.0")
    for bad in ("torch", "torch<3", "torch>=2,>=3"):
        with pytest.raises(AssertionError, match="lower bound"):
            lower_bound(Requirement(bad))


def test_pyproject_license_is_an_spdx_string():
    """A `license = { text = ... }` table makes setuptools>=77 print a page of deprecation
    warnings."""
    data = _pyproject()
    assert data["project"]["license"] == "MIT"
    assert any(r.startswith("setuptools>=") and Version(r.split(">=")[1].split()[0])
               >= Version("77") for r in data["build-system"]["requires"])
