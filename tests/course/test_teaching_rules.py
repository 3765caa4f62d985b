"""The rules every notebook's teaching text and code keep (checked on the stored notebooks, no
kernel).

- Claims are fixed prose: no f-string writes a verdict ("... if x else ..."), and no bare `assert`
  sits among the teaching code. A claim is asserted in a cell tagged "claim-check" (stored
  collapsed, left off the site) by `rlhf_helpers.course.claims.check_claims`; asserts inside a check
  function (`def check_...`) are the exercise checks.
- Short cells: a code cell holds at most MAX_CODE_LINES lines (the Colab set-up cell is generated).
- Each notebook opens with its prerequisites and a student's estimated time.
- Each exercise has a list of plausible wrong answers (tests/mistakes/<notebook>.py) that the
  solutions run proves its check rejects (tests/notebooks/test_notebooks.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from mistakes import load_mistakes
from tool_scripts import load_tool

from rlhf_helpers.course.claims import NOTE_HEAD, STRICT_ENV, ClaimContradicted, check_claims

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
builder = load_tool("build_notebooks")
#: the longest code cell a reader meets; longer ones split into compute / figure / reading cells
MAX_CODE_LINES = 40
#: an f-string whose braces hold a conditional expression: prose that changes with the run
_VERDICT = re.compile(r"""\bf(["'])(?:(?!\1).)*\{[^{}]*\bif\b[^{}]*\belse\b[^{}]*\}""")
_EXERCISE = re.compile(r"^# EXERCISE (\d+)\s*$", re.MULTILINE)


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _code_cells(path: Path) -> list[tuple[int, nbformat.NotebookNode]]:
    cells = nbformat.read(path, as_version=4).cells
    return [(i, c) for i, c in enumerate(cells)
            if c.cell_type == "code" and "colab-setup" not in _tags(c) and i != 1]


def _top_level_asserts(source: str) -> list[int]:
    """Line numbers of `assert` statements outside any function of a cell (IPython magics
    stripped)."""
    tree = ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                               for line in source.splitlines()))
    inside = {id(node) for fn in ast.walk(tree)
              if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) for node in ast.walk(fn)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Assert) and id(node) not in inside]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_prose_is_generated_by_a_conditional_f_string(path: Path):
    found = [(i, line.strip()) for i, cell in _code_cells(path) for line in cell.source.splitlines()
             if _VERDICT.search(line)]
    assert not found, (f"{path.name}: state the claim once in markdown and check it in a "
                       f"claim-check cell: {found}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_asserts_live_in_claim_checks_or_exercise_checks(path: Path):
    found = [(i, lines) for i, cell in _code_cells(path) if "claim-check" not in _tags(cell)
             and (lines := _top_level_asserts(cell.source))]
    assert not found, f"{path.name}: bare asserts among the teaching code (cell, lines): {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_claim_checks_are_collapsed_and_call_check_claims(path: Path):
    checks = [(i, cell) for i, cell in _code_cells(path) if "claim-check" in _tags(cell)]
    for i, cell in checks:
        assert cell.metadata.get("jupyter",
                                 {}).get("source_hidden") is True, f"{path.name} cell {i}"
        assert "check_claims(" in cell.source, (
            f"{path.name} cell {i}: a claim-check cell calls check_claims")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_code_cells_are_short(path: Path):
    long = [(i, n) for i,
            cell in _code_cells(path) if (n := len(cell.source.splitlines())) > MAX_CODE_LINES]
    assert not long, f"{path.name}: cells over {MAX_CODE_LINES} lines (cell, lines): {long}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_opens_with_prerequisites_and_time(path: Path):
    first = nbformat.read(path, as_version=4).cells[0].source
    assert re.search(r"^\*\*Prerequisites:\*\* \S", first,
                     re.MULTILINE), f"{path.name}: no **Prerequisites:** line"
    time_line = (r"^\*\*Time:\*\* about \d+ min for the core[^;]*; "
                 r"the deep dives add about \d+ min\.$")
    assert re.search(time_line, first, re.MULTILINE), \
        f"{path.name}: no '**Time:** about N min for the core; ...' line (course_time --write)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_exercise_lists_wrong_answers_that_edit_its_solution(path: Path):
    text = "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
    exercises = _EXERCISE.findall(text)
    mistakes = load_mistakes(path.stem)
    assert sorted(mistakes) == sorted(exercises), \
        f"{path.name}: mistakes for {sorted(mistakes)}, exercises {exercises}"
    solutions = {n: code for n, code in re.findall(
        r"<summary>Solution (\d+)</summary>.*?```python\n(.*?)```", text, re.DOTALL)}
    for number, wrong in mistakes.items():
        assert len(wrong) >= 2, \
            f"{path.name} exercise {number}: list at least two plausible wrong answers"
        for mistake in wrong:
            assert solutions[number].count(mistake.old) == 1, (
                f"{path.name} exercise {number}, {mistake.what!r}: "
                f"the edited text must occur once in Solution {number}")
            assert mistake.apply(solutions[number]) != solutions[number]


def test_check_claims_passes_fails_and_skips_other_profiles(monkeypatch, capsys):
    monkeypatch.delenv("RLHF_PROFILE", raising=False)
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    monkeypatch.setenv(STRICT_ENV, "1")
    check_claims({"one is less than two": 1 < 2})
    assert "holds (1 checked)" in capsys.readouterr().out
    with pytest.raises(ClaimContradicted, match="two is less than one"):
        check_claims({"one is less than two": 1 < 2, "two is less than one": 2 < 1})
    with pytest.raises(ValueError, match="expected a bool"):
        check_claims({"a list is not a verdict": [True]})
    with pytest.raises(ValueError, match="at least one"):
        check_claims({})
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"total_steps": 3}')
    check_claims({"two is less than one": 2 < 1})  # another run: not checked
    one = capsys.readouterr().out.strip()
    check_claims({f"claim {k}": False for k in range(13)})
    many = capsys.readouterr().out.strip()
    assert one.startswith("Not checked: this claim is") and "these 13 claims are" in many
    assert max(len(one), len(many)) <= 88, (one, many)  # the width an output box holds
    with pytest.raises(ClaimContradicted):
        check_claims({"two is less than one": 2 < 1}, any_profile=True)


def test_outside_the_tests_a_contradicted_claim_prints_a_note_with_this_run_s_numbers(
        monkeypatch, capsys):
    """A learner's kernel: no exception; the note says what the text says, what this run measured
    (both sides of the comparison, evaluated again from this function's source) and that runs
    differ between machines."""
    monkeypatch.delenv("RLHF_PROFILE", raising=False)
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    monkeypatch.setenv(STRICT_ENV, "0")
    rise = 0.83
    check_claims({"the score rises by over 1": rise > 1.0, "it is positive": rise > 0})
    out, err = capsys.readouterr()
    assert "1 of 2 claims of the text above hold" in out
    assert err.startswith(NOTE_HEAD)
    assert "The text says: the score rises by over 1" in err and "it is positive" not in err
    assert "rise > 1.0  ->  0.83 > 1" in err
    assert "differs between CPUs" in NOTE_HEAD


def test_claim_measures_read_each_side_and_the_deciding_margin(monkeypatch, tmp_path):
    """The log's margins against hand-computed ones: a chain keeps its tighter pair, `and` the
    smaller relative slack, `or` the larger; an equality has sides but no slack; a 0-d tensor is a
    number."""
    import json

    import torch

    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv("RLHF_CLAIM_LOG", str(log))
    monkeypatch.setenv("RLHF_CLAIM_NOTEBOOK", "toy")
    gap, kl, count = 1.1, torch.tensor([1e-7, -2e-6]), 2
    check_claims({"gap in band": 0.8 < gap < 1.4,
                  "kl tiny and gap big": bool(kl.abs().max() < 1e-4) and gap > 1.0,
                  "either": gap > 5 or gap > 1.0,
                  "two of them": count == 2}, any_profile=True)
    rows = {r["claim"]: r for r in map(json.loads, log.read_text().splitlines())}
    assert {r["notebook"] for r in rows.values()} == {"toy"}
    band = rows["gap in band"]
    assert [s["text"] for s in band["sides"]] == ["0.8 < gap", "gap < 1.4"]
    assert band["slack"] == pytest.approx(0.3) and band["relative"] == pytest.approx(0.3 / 1.4)
    both = rows["kl tiny and gap big"]
    assert both["sides"][0]["left"] == pytest.approx(2e-6)
    # relative slacks: (1e-4 - 2e-6) / 1e-4 = 0.98 and (1.1 - 1) / 1.1 = 0.0909: the second decides
    assert both["relative"] == pytest.approx(0.1 / 1.1) and both["slack"] == pytest.approx(0.1)
    assert rows["either"]["relative"] == pytest.approx(0.1 / 1.1)  # the larger of -0.78 and 0.09
    two = rows["two of them"]
    assert two["slack"] is None and two["sides"][0]["left"] == 2.0 and two["holds"] is True


def test_a_contradicted_claim_in_a_learner_s_notebook_prints_its_note_and_the_next_cell_runs(
        tmp_path, monkeypatch):
    """The notebook as a learner runs it (RLHF_STRICT_CLAIMS unset in the kernel): the check cell
    prints the note on stderr and the cell after it runs; under the tests' setting the same cell
    stops the notebook."""
    from nbclient.exceptions import CellExecutionError

    from rlhf_helpers.course.run_course import execute_notebook

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from rlhf_helpers.course.claims import check_claims\n"
                                  "rise = 0.4"),
        nbformat.v4.new_code_cell('check_claims({"the score rises by over 1": rise > 1.0})'),
        nbformat.v4.new_code_cell('print("the next cell ran")')])
    path = tmp_path / "claims.ipynb"
    nbformat.write(nb, path)
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    monkeypatch.setenv("RLHF_PROFILE", "tiny")
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv(STRICT_ENV)
    ran = execute_notebook(path, timeout=120)
    streams = [(o["name"], o["text"]) for cell in ran.cells[1:] for o in cell.outputs
               if o["output_type"] == "stream"]
    assert ("stderr", NOTE_HEAD) in [(name, text[:len(NOTE_HEAD)]) for name, text in streams]
    assert "rise > 1.0  ->  0.4 > 1" in "".join(text for _, text in streams)
    assert ("stdout", "the next cell ran\n") in streams
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(CellExecutionError, match="ClaimContradicted"):
        execute_notebook(path, timeout=120)


def test_rules_catch_what_they_forbid():
    """Each rule's detector fires on a sample of what it forbids, and not on what it allows."""
    assert _VERDICT.search("""print(f"the score {'rises' if up else 'falls'}")""")
    assert not _VERDICT.search("""print(f"score {score:.3f}")""")
    assert _top_level_asserts("x = 1\nassert x == 1\n") == [2]
    assert _top_level_asserts("def check_x():\n    assert 1\n") == []
    cell = builder.read_cells('# %% [markdown]\n# t\n\n# %% tags=["colab-setup"]\n\n'
                              '# %% tags=["claim-check"]\ncheck_claims({"a": True})\n',
                              "07_x.ipynb")[-1]
    assert cell.metadata == {"tags": ["claim-check"], "jupyter": {"source_hidden": True}}


#: notebooks whose collapsed claim-checks still show a claim on their first line (to open with
#: `check_claims({`)
_CLAIM_ON_FIRST_LINE: frozenset[str] = frozenset()


def _claims_checked(source: str) -> list[str]:
    """The claims (the keys of each `check_claims({...})` literal) of a cell's source."""
    tree = ast.parse(source)
    return [key.value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "check_claims"
            and node.args and isinstance(node.args[0], ast.Dict)
            for key in node.args[0].keys
            if isinstance(key, ast.Constant) and isinstance(key.value, str)]


def _claims_on_first_line(path: Path) -> list[tuple[int, str]]:
    return [(i, claim) for i, cell in _code_cells(path) if "claim-check" in _tags(cell)
            for claim in _claims_checked(cell.source) if claim in cell.source.split("\n")[0]]


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True,
                                            reason="a claim on a claim-check's first line"))
    if p.stem in _CLAIM_ON_FIRST_LINE else p for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_a_collapsed_claim_check_shows_no_claim_on_its_first_line(path: Path):
    """JupyterLab shows the first line of a collapsed cell above its output: a claim there is the
    prose's claim printed a second time, in code."""
    shown = _claims_on_first_line(path)
    assert not shown, (
        f"{path.name}: open the claim-check with `check_claims({{` on a line of its own: {shown}")


def test_the_first_line_rule_finds_a_claim_there_and_not_below():
    source = 'x = 1\ncheck_claims({"a": x > 0,\n    "b": True}, any_profile=True)'
    assert _claims_checked(source) == ["a", "b"]
    assert _claims_checked("check_claims(claims)\nprint('a')") == []
    cell = 'check_claims({"x is positive": x > 0,\n              "y too": y > 0})'
    assert [c for c in _claims_checked(cell) if c in cell.split("\n")[0]] == ["x is positive"]
    cell = 'check_claims({\n    "x is positive": x > 0,\n})'
    assert [c for c in _claims_checked(cell) if c in cell.split("\n")[0]] == []
