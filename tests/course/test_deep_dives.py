"""Each notebook's core path runs without its deep dives, and ends with questions to check
understanding (rlhf_helpers.course.deep_dives); the README's course map, its four-week plan and each
header state the minutes tools/course_time.py estimates, and a core over two hours says where to
break it."""

from __future__ import annotations

import nbformat
import pytest
from tool_scripts import load_tool

from rlhf_helpers.course.deep_dives import (
    DEEP_DIVE_NOTE,
    QUIZ_HEADING,
    Cell,
    as_cells,
    bad_deep_dive_notes,
    in_deep_dive,
    names_only_deep_dives_define,
    quiz_answers,
)
from rlhf_helpers.course.run_course import course_notebooks

NOTEBOOKS = course_notebooks()
course_time = load_tool("course_time")


def md(text: str) -> Cell:
    return Cell("markdown", text)


def code(text: str) -> Cell:
    return Cell("code", text)


def test_a_deep_dive_runs_to_the_next_heading_of_its_level_or_higher():
    cells = [md("## 1. Core"), code("x = 1"), md(f"### Deep dive: more\n\n{DEEP_DIVE_NOTE}"),
             code("y = x"), md("#### a sub-heading inside it"), code("z = y"),
             md("### 2. Back on the core"), code("w = x"),
             md(f"## Deep dive: the appendix\n\n{DEEP_DIVE_NOTE}"), md("### A. still the appendix"),
             code("v = 1"), md("# Next part"), code("u = 2")]
    assert in_deep_dive(cells) == [False, False, True, True, True, True, False, False, True, True,
                                   True, False, False]


def test_a_core_cell_that_reads_what_only_a_deep_dive_defined_is_named():
    cells = [md("## Core"), code("import torch\nx = torch.ones(2)"),
             md(f"## Deep dive: d\n\n{DEEP_DIVE_NOTE}"),
             code("y = x * 2\ndef helper(a):\n    return a + y"), md("## Core again"),
             code("print(x)"),  # fine: the core defined x
             # breaks: only the deep dive defined helper
             code("def later():\n    return helper(1)"),
             code("y = 3\nprint(y)")]  # fine: this cell binds y itself
    assert names_only_deep_dives_define(cells) == [(6, "helper")]
    skipped = [cell for cell, deep in zip(cells, in_deep_dive(cells), strict=True) if not deep]
    namespace: dict = {}
    # what the static check predicts, by running the core alone
    with pytest.raises(NameError, match="helper"):
        for cell in skipped:
            if cell.kind == "code":
                exec(cell.source, namespace)  # noqa: S102  # the test's own cells, above
        namespace["later"]()


def test_a_deep_dive_needs_its_note_and_a_quiz_counts_its_answers():
    assert (bad_deep_dive_notes([md("## Deep dive: no note\n\nSome text.")])
            == ["Deep dive: no note"])
    assert bad_deep_dive_notes([md(f"## Deep dive: fine\n\n{DEEP_DIVE_NOTE}\n\nText.")]) == []
    quiz = [md(f"{QUIZ_HEADING}\n\n1. Why?\n<details><summary>Answer</summary>Because.</details>"),
            md("2. And?\n<details><summary>Answer</summary>So.</details>"), md("## Appendix"),
            md("<details><summary>Answer</summary>not in the quiz</details>")]
    assert quiz_answers(quiz) == 2 and quiz_answers([md("## Summary")]) is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_core_path_runs_without_the_deep_dives(path):
    cells = as_cells(nbformat.read(path, as_version=4).cells)
    assert not bad_deep_dive_notes(cells), \
        f"each deep dive's second paragraph must be {DEEP_DIVE_NOTE!r}"
    broken = names_only_deep_dives_define(cells)
    assert not broken, (
        f"core cells read names only a deep dive defines (cell index, name): {broken}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_ends_with_three_to_five_questions(path):
    cells = as_cells(nbformat.read(path, as_version=4).cells)
    answers = quiz_answers(cells)
    assert answers is not None, f"{path.name} has no {QUIZ_HEADING!r} section"
    assert 3 <= answers <= 5, f"{path.name}: {answers} collapsed answers, expected 3 to 5"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_deep_dive_headings_are_stored_folded(path):
    nb = nbformat.read(path, as_version=4)
    for cell, deep in zip(nb.cells, in_deep_dive(as_cells(nb.cells)), strict=True):
        opens = (cell.cell_type == "markdown"
                 and cell.source.startswith(("## Deep dive:", "### Deep dive:")))
        assert cell.metadata.get("jp-MarkdownHeadingCollapsed",
                                 False) is opens and (deep or not opens)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_core_over_two_hours_says_so_and_where_to_break(path):
    """A core is not squeezed to two hours: over them, its header says it takes two sittings and
    names a core heading of the notebook where the second starts."""
    found = course_time.estimate(path)
    core = course_time.rounded(found.core.minutes)
    header = course_time.header_minutes(path) or ""
    if core <= course_time.SITTING_MIN:
        assert found.sitting is None and "sittings" not in header, header
        return
    headings = [cell.source.split("\n", 1)[0].lstrip("# ")
                for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "markdown"]
    assert found.sitting in headings, f"{path.name}: no heading {found.sitting!r}"
    assert f"in two sittings (the second from *{found.sitting.split(': ')[0]}*)" in header, (
        f"{path.name}: core estimated at {core} min, but its header says {header!r} "
        "(python tools/course_time.py --write)")


def test_the_readme_course_map_states_the_measured_minutes(capsys):
    assert course_time.main(["--check"]) == 0, capsys.readouterr().out
