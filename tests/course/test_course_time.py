"""tools/course_time.py counts what a learner does: each activity at its own rate, the reuse of
earlier core solutions only, the break of a core over two hours, and the four-week plan."""

from __future__ import annotations

import pytest
from tool_scripts import load_tool

from rlhf_helpers.course.deep_dives import DEEP_DIVE_NOTE, QUIZ_HEADING, Cell

course_time = load_tool("course_time")


def md(text: str) -> Cell:
    return Cell("markdown", text)


def code(text: str, tags: tuple[str, ...] = ()) -> Cell:
    return Cell("code", text, tags)


def solution(number: int, body: str) -> str:
    return f"<details><summary>Solution {number}</summary>\n\n```python\n{body}```\n</details>"


def test_solution_lines_count_what_a_learner_writes():
    solution_code = (
        'def f(x):\n    """Doc\n    string."""\n    # a comment\n    y = x + 1\n\n    return y\n')
    assert course_time.solution_lines(solution_code) == 2


@pytest.mark.parametrize(("source", "expected"), [
    ("x = 1\nprint(x)\nprint(x + 1)", (0, 2)),
    ("fig = go.Figure()\nfig.show()", (1, 0)),  # a call that shows, counted once
    ("display(table)\nexplorer = widgets.ClipExplorer()\nexplorer", (2, 0)),  # the last name shows
    ("plot_curves(history,\n            keys=['kl'])", (1, 0)),
    ("torch.set_num_threads(1)  # returns None: shows nothing", (0, 0)),
    ("table = make()\n# a comment last", (0, 0)),
    ("for row in rows:\n    print(row)\nwrap_printed('x')", (0, 1)),  # a loop's print counts once
])
def test_shown_counts_figures_tables_and_prints(source, expected):
    assert course_time.shown(source) == expected


def test_each_activity_is_counted_where_it_sits():
    cells = [
        md("# 0 · A notebook\n\n**Time:** about 5 min for the core."),
        md("## 1. Read\n\nPredict the sign before you run the next cell."),  # one prediction
        code("y = 2\ndisplay(y)\nprint(y)"),
        code("# EXERCISE 1\ndef f():\n    raise NotImplementedError"),  # a stub: not read
        code("def check_f():\n    assert f() == 1\n\nexercise_check('Exercise 1', check_f)"),
        md(solution(1, "def f():\n    a = 1\n    return a\n")),
        code("check_claims({'x': True})", ("claim-check",)),  # hidden: not read
        md("#### Predict, then drag\n\n1. Which?\n<details><summary>Answer</summary>This."
           "</details>\n2. And?\n<details><summary>Answer</summary>That.</details>"),  # two
        md(f"## Deep dive: the loop\n\n{DEEP_DIVE_NOTE}"),
        md(solution(2, "def g(model, opt):\n    model(1).backward()\n    opt.step()\n")),
        md(f"{QUIZ_HEADING}\n\n1. Why?\n<details><summary>Answer</summary>Because.</details>"),
    ]
    parts = course_time.cell_parts_of(cells, set())
    core = sum((c.part for c in parts if not c.deep), course_time.Part())
    deep = sum((c.part for c in parts if c.deep), course_time.Part())
    assert (core.code_lines, core.displays, core.prints) == (3, 1, 1)
    assert (core.predictions, core.quiz_answers, core.exercise_lines) == (3, 1, ((2, 0),))
    assert core.integration == 0 and deep.integration == 1  # deep: its solution runs the model
    assert [c.dive for c in parts if c.deep] == ["the loop", "the loop"]
    minutes = course_time.Part(predictions=3, quiz_answers=1).minutes
    assert minutes == 3 * course_time.PREDICTION_MIN + course_time.QUIZ_ANSWER_MIN


def test_only_earlier_core_solutions_are_credited_as_written_before():
    first = [md("## 1. Core"), md(solution(1, "def f(x):\n    y = x + 1\n    return y\n")),
             md(f"## Deep dive: optional\n\n{DEEP_DIVE_NOTE}"),
             md(solution(2, "def g(x):\n    z = x * 2\n    return z\n"))]
    earlier: set[str] = set()
    course_time.cell_parts_of(first, earlier)
    assert earlier == {"y = x + 1", "return y"}  # the deep dive's solution credits nothing later
    later = course_time.cell_parts_of(
        [md(solution(1, "def h(x):\n    y = x + 1\n    z = x * 2\n    return y + z\n"))], earlier)
    assert later[0].part.exercise_lines == ((2, 1),)  # z = x * 2 and the return are new


def test_waiting_is_the_runs_cpu_time_times_the_waits():
    seconds = 90.0
    waiting = course_time.Part(run_seconds=seconds).components()["waiting"]
    assert waiting == pytest.approx(course_time.RUN_WAITS * seconds / 60)
    row = ("| [05 Full PPO](notebooks/05_full_ppo.ipynb) | what | 120 min core + 225 min deep "
           "dives | 3.5 min |\n| [06 Six](x.ipynb) | what | 5 min core + 5 min deep dives | 91 s |")
    assert course_time.cpu_seconds(row) == {"05": 210.0, "06": 91.0}


def _notebook(minutes: list[float]) -> list:
    """CellParts of core sections of these minutes, each opened by its heading."""
    return [course_time.CellPart(f"{i}. s", False, course_time.Part(words=int(50 * m)), None,
                                 f"{i}. s") for i, m in enumerate(minutes, start=1)]


def test_a_long_core_breaks_at_the_heading_nearest_its_middle():
    cells = _notebook([40, 30, 20, 60])  # 150 min: 40 | 70 | 90 before sections 2, 3, 4
    assert course_time.second_sitting(cells, 150.0) == "3. s"  # 70 is nearest 75
    assert course_time.second_sitting(_notebook([60, 60]), 120.0) is None  # two hours: one sitting
    line = course_time.time_line(150, 30, "3. s: its subtitle")
    assert line == ("**Time:** about 150 min for the core, in two sittings (the second from "
                    "*3. s*); the deep dives add about 30 min.")
    assert course_time.time_line(100, 30) == (
        "**Time:** about 100 min for the core; the deep dives add about 30 min.")


def test_the_plan_adds_each_weeks_cores_and_essential_deep_dives(monkeypatch):
    monkeypatch.setattr(course_time, "PLAN", ((1, "topic", ("01", "02")),))
    monkeypatch.setattr(course_time, "ESSENTIAL_DEEP_DIVES", {"01": ("the var", "oth")})
    estimates = {
        "01": course_time.Estimate(course_time.Part(words=50 * 62), course_time.Part(), None,
                                   {"the variance": 29.0, "other": 31.0, "skipped": 50.0}),
        "02": course_time.Estimate(course_time.Part(words=50 * 90), course_time.Part(), None, {})}
    table = course_time.plan_table(estimates).splitlines()
    # rounded as the course map states them: 60 + 90 core, 30 + 30 deep
    assert table[2] == "| 1 | topic | 01, 02 | 01: *the variance*, *other* | 3.5 h: 2.5 + 1.0 |"
    monkeypatch.setattr(course_time, "ESSENTIAL_DEEP_DIVES", {"01": ("gone",)})
    with pytest.raises(KeyError, match="gone"):
        course_time.plan_table(estimates)


def test_a_prefix_no_notebook_has_is_refused_naming_it_and_the_notebooks(capsys):
    """Before: `course_time.py 99` printed a table of no notebook, totalling 0.0 hours, exit 0."""
    assert course_time.main(["99", "05"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no table
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "course_time: error: no notebook name starts with '99'; the notebooks are 01_"), err
    assert all(path.stem in err[0] for path in course_time.notebooks())


def test_an_executed_folder_that_is_missing_or_a_file_is_refused_naming_it(tmp_path, capsys):
    """Before: `--executed /nonexistent 05` printed the comparison's header and no row, exit 0."""
    afile = tmp_path / "afile"
    afile.write_text("not notebooks", encoding="utf-8")
    for executed, why in ((tmp_path / "nonexistent", "does not exist"), (afile, "is not a folder")):
        assert course_time.main(["--executed", str(executed), "05"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # no table
        assert captured.err.strip().splitlines() == [
            f"course_time: error: --executed {executed} {why}; give the folder of executed "
            "notebooks (e.g. build/executed)"]
