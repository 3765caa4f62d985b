"""Every Colab badge and relative link in the notebooks and the README points at a file that
exists."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from rlhf_helpers.course import notebook as header

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MARKDOWN_FILES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "docs" / "running.md",
                  *sorted((ROOT / "notebooks").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")  # markdown [text](target)
_HREF = re.compile(r"""(?:href|src)=["']([^"']+)["']""")
_COLAB = re.compile(
    r"^https://colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/([^/]+)/(.+)$")


def _markdown(path: Path) -> str:
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return path.read_text(encoding="utf-8")


def _targets(text: str) -> list[str]:
    return _LINK.findall(text) + _HREF.findall(text)


DOCUMENTS = NOTEBOOKS + [p for p in MARKDOWN_FILES if p.exists()]


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.name for p in DOCUMENTS])
def test_links_point_at_existing_files(path: Path):
    broken = []
    for target in _targets(_markdown(path)):
        colab = _COLAB.match(target)
        if colab:
            slug, ref, repo_path = colab.groups()
            if slug != header.REPO_SLUG or ref != header.BADGE_REF or not (ROOT
                                                                           / repo_path).is_file():
                broken.append(target)
        elif target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        else:
            local = (path.parent / target.split("#", 1)[0]).resolve()
            if not local.exists():
                broken.append(target)
    assert not broken, f"{path.name}: broken links {broken}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_badge_opens_this_notebook(path: Path):
    first = nbformat.read(path, as_version=4).cells[0]
    assert first.cell_type == "markdown"
    assert header.colab_badge(path.name) in first.source


def test_colab_url_is_built_from_the_single_slug_and_ref():
    url = header.colab_url("01_policy_gradients.ipynb")
    assert url == ("https://colab.research.google.com/github/rlhf-course/rlhf-ppo-course/blob/main/"
                   "notebooks/01_policy_gradients.ipynb")
    assert _COLAB.match(url).groups() == (header.REPO_SLUG, header.BADGE_REF,
                                           "notebooks/01_policy_gradients.ipynb")


@pytest.mark.parametrize("bad", ["01.py", "notebooks/01.ipynb", ""])
def test_colab_url_rejects_what_is_not_a_notebook_file_name(bad: str):
    with pytest.raises(ValueError, match="notebook"):
        header.colab_url(bad)


def test_link_checker_catches_a_missing_file():
    text = ("[ok](README.md) [gone](nothing/here.md) "
            "[c](https://colab.research.google.com/github/x/y/blob/main/a.ipynb)")
    targets = _targets(text)
    assert targets == ["README.md", "nothing/here.md",
                       "https://colab.research.google.com/github/x/y/blob/main/a.ipynb"]
    assert not (ROOT / "nothing/here.md").exists()
    assert _COLAB.match(targets[2]).group(1) != header.REPO_SLUG


def test_contributing_names_only_functions_and_files_that_exist():
    """CONTRIBUTING.md's iteration map names `file:function` hops and its table names modules and
    test files: each must exist, and every module of the package must be in the table, so the page
    cannot rot."""
    import ast

    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    hops = re.findall(r"`(?:rlhf_helpers/\w+/)?(\w+\.py):(\w+)`", text)
    assert len(hops) >= 12
    for file, function in hops:
        paths = list((ROOT / "rlhf_helpers").rglob(file))
        assert len(paths) == 1, f"{file}: {paths}"
        names = {node.name for node in ast.walk(ast.parse(paths[0].read_text()))
                 if isinstance(node, ast.FunctionDef)}
        assert function in names, f"{file} has no function {function}"
    table = text[text.index("| module | tests |"):]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:] if line.startswith("| ")]
    covered = set()
    for modules, tests in rows:
        for test in re.findall(r"(?:\w+/)?test_[\w*]+\.py", tests):  # its layer's folder first
            assert list((ROOT / "tests").glob(test)), test
        for module in re.findall(r"[\w/]+(?:\.py|/)", modules):
            if module == "benchmarks/":  # the one row outside the package
                assert (ROOT / module).is_dir()
                continue
            if module.endswith("/"):
                found = [p for p in (ROOT / "rlhf_helpers" / module).glob("*.py")
                         if p.name != "__init__.py"]
            else:
                found = [ROOT / "rlhf_helpers" / module]
            assert all(p.is_file() for p in found) and found, module
            covered |= {p.relative_to(ROOT / "rlhf_helpers").as_posix() for p in found}
    package = {p.relative_to(ROOT / "rlhf_helpers").as_posix()
               for p in (ROOT / "rlhf_helpers").rglob("*.py") if p.name != "__init__.py"}
    assert package - covered == set(), "modules missing from CONTRIBUTING.md's table"
