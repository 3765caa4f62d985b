"""How long each notebook's core path and deep dives take a learner: the README's course-map times,
each header's time line and the README's four-week plan.

Usage:
    python tools/course_time.py            # core and deep-dive minutes, the core's by activity
    python tools/course_time.py 05 07      # only the notebooks whose names start with these (exit 2
                                           # when one matches none)
    python tools/course_time.py --sections # also the minutes of each section
    python tools/course_time.py --executed build/executed  # outputs counted against a run's
    python tools/course_time.py --write    # state the minutes in the headers, map and plan
    python tools/course_time.py --check    # exit 1 when a header, the map or the plan differs

The minutes are an estimate, made the same way for every notebook from what it contains, counted in
the stored notebook (core and deep dives split by `rlhf_helpers.course.deep_dives`). Each thing a
learner does has its own rate:
- reading prose: the markdown's words (solution blocks and the header's time line excepted,
  collapsed answers included), at READING_WORDS_PER_MIN;
- reading code: the lines of the code cells a learner reads (not the exercise stubs, the checks,
  the hidden claim checks or the Colab set-up cell), at CODE_LINES_PER_MIN;
- reading outputs: in those same cells, DISPLAY_MIN per figure, table or widget shown
  (`display(...)`, `.show()`, a live figure, a bare name or a plotting call as a cell's last
  statement) and PRINT_MIN per `print(...)` call (about 15 s a line). They are counted in the
  cells, not in an executed notebook, so that the stated minutes do not depend on which run, or
  which stale build folder, is at hand. Against the executed course (tiny profile, main at 755d76b)
  the counts found 78 of its 87 figures and tables, and a print call showed 3.4 lines on average (a
  print in a loop counts once); `--executed` puts the counts beside a run's;
- predictions: PREDICTION_MIN per question a learner answers before opening its answer or running
  the cell (a collapsed `Answer` outside the closing questions, or a markdown cell that says
  "Predict" and holds none);
- the closing questions (`## Check your understanding`): QUIZ_ANSWER_MIN per answer;
- exercises: EXERCISE_BASE_MIN each, plus EXERCISE_MIN_PER_LINE per line of its worked solution
  (the statements a learner writes, not the signature, the docstring or comments); a line that an
  earlier notebook's **core** solutions already hold counts REUSED_MIN_PER_LINE (and an exercise
  made only of such lines, REUSED_EXERCISE_BASE_MIN instead of the base). A deep dive's solution
  is optional, so it credits nothing later;
- debugging integration exercises: INTEGRATION_EXERCISE_MIN more for an exercise whose worked
  solution runs the model or an optimiser (`model.`, `.backward(`, `.step()`): its check samples
  or trains, and a mistake shows only as numbers that differ several steps in;
- waiting for runs, on the core (Run All runs the folded deep dives' cells too): RUN_WAITS times
  the notebook's CPU time as the README's course map states it (the `tiny` profile, measured by
  `make course` on a fresh clone): a learner runs most cells twice, once to read them and again
  after an exercise.

Calibration: the rates are a model, not a measurement of students. The prose, code and exercise
rates are those of a first-year PhD student working carefully (they put the course before the
core/deep-dive split at 25 hours, inside an instructor's estimate of 22 to 28 hours for it). The
other rates were then chosen so that the course as two independent reviews read it (main at
0a16302, teaching pass 5) comes out where they put it: the reviews ask for 19-24 hours of cores; the
deep-RL lecturer estimated 19.2 hours, against 15.7 by the old rates, with 02, 05, 06, 07 and 08
under-estimated by 20-75%. With these rates that course's cores come out at 20.3 hours: 02, 05, 06,
07 and 08 27-73% above the old estimate (08 the most: both its exercises run the model, and 05's
update loop, an optional deep dive there, no longer counts as written before), 01, 03 and 04 11-21%
above. No rate was fitted notebook by notebook. A core over SITTING_MIN minutes is not squeezed to
fit: its header says it takes two sittings and names the heading the second starts from
(`second_sitting`).
"""

from __future__ import annotations

# ruff: noqa: E402 - run as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("tools/course_time.py")

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlhf_helpers.course.deep_dives import (  # noqa: E402
    ANSWER_SUMMARY,
    QUIZ_HEADING,
    Cell,
    as_cells,
    heading,
    in_deep_dive,
)
from rlhf_helpers.runtime.interrupt import one_line_interrupt  # noqa: E402

NOTEBOOK_DIR = ROOT / "notebooks"
SOURCE_DIR = NOTEBOOK_DIR / "src"
README = ROOT / "README.md"
#: words of technical prose with equations read per minute, carefully (a fifth of casual reading
#: speed)
READING_WORDS_PER_MIN = 50.0
#: lines of course code read and understood per minute
CODE_LINES_PER_MIN = 5.0
#: minutes to read one figure, table or widget a cell shows: its axes or columns, and the numbers
#: the prose points at
DISPLAY_MIN = 2.0
#: minutes to read what one print call shows
PRINT_MIN = 1.0
#: minutes per prediction: think, commit to an answer, then run, drag or open it and compare
PREDICTION_MIN = 2.0
#: minutes per closing question: an answer thought through (or written) before opening it
QUIZ_ANSWER_MIN = 3.0
#: minutes per exercise before writing anything: reading its task, the check's messages, a first
#: attempt
EXERCISE_BASE_MIN = 15.0
#: minutes per line of an exercise's worked solution: writing, running the check, fixing
EXERCISE_MIN_PER_LINE = 2.0
#: minutes per line a learner wrote before, in an earlier notebook's core exercise (the same
#: statement)
REUSED_MIN_PER_LINE = 0.5
#: minutes for an exercise made only of lines written before (pasting an earlier answer)
REUSED_EXERCISE_BASE_MIN = 5.0
#: extra minutes for an exercise whose solution runs the model or an optimiser: debugging a loop
#: whose check trains or samples
INTEGRATION_EXERCISE_MIN = 20.0
#: how many times a learner waits for a notebook's runs (the first pass, then the re-runs after
#: the exercises)
RUN_WAITS = 2.0
#: a core estimated at more minutes than this takes two sittings, and its header says where to break
SITTING_MIN = 120
#: the four-week plan in the README: (week, its topic, its notebooks)
PLAN = ((1, "from policy gradients to PPO's objective; the reward model", ("01", "02")),
        (2, "rewards per token and GAE; the clipped losses", ("03", "04")),
        (3, "PPO on a language model, and how it fails", ("05", "06")),
        (4, "methods without a critic; PPO written whole", ("07", "08")))
#: per notebook, the deep dives a lecturer's module should not skip, by the start of their titles
#: (after "Deep dive: "); --check fails when one of them is no longer a deep dive of its notebook
ESSENTIAL_DEEP_DIVES = {
    "01": ("measuring the variance of each estimator", "one large step, many steps on one batch"),
    "02": ("why compare instead of score?",),
    "03": ("the three estimators, measured", "bias against variance, measured on a chain"),
    "04": ("the KL-penalty form beside the clip form", "several epochs on one batch"),
    "05": ("the run doctor",),  # 08 teaches the update loop in its core
    "06": ("(d) negative KL", "(e) an untrained value head"),
    "07": ("KL in the reward, or KL in the loss?",),
}
_SOLUTION = re.compile(r"<details><summary>Solution \d+</summary>.*?</details>", re.DOTALL)
_SOLUTION_CODE = re.compile(r"<summary>Solution (\d+)</summary>.*?```python\n(.*?)```", re.DOTALL)
#: a worked solution that runs the model or an optimiser
_RUNS_MODEL = re.compile(r"\bmodel[.(]|\.backward\(|\.step\(\)")
_DISPLAY_CALL = re.compile(r"(?<![\w.])display\(|\.show\(|\bLiveFigure\(")
_PRINT_CALL = re.compile(r"(?<![\w.])print\(")
#: what Jupyter shows when a cell's last statement is it: a bare name or attribute (a widget, a
#: figure, a table), or a call of a plotting function
_LAST_EXPRESSION = re.compile(r"^[A-Za-z_][\w.]*$|^[\w.]*plot\w*\(", re.DOTALL)
_PREDICT = re.compile(r"\bPredict\b")
_ROW = re.compile(r"^(\| \[(\d\d) [^|]*\]\([^)]*\) \|.*\| )(\d+) min core \+ (\d+) min deep dives( "
                  r"\| ([\d.]+) (s|min) \|)", re.MULTILINE)
#: the header's time line, in a notebook source (`# ` before it) or a stored notebook's first cell
_TIME_LINE = re.compile(r"^(# )?\*\*Time:\*\* .*$", re.MULTILINE)
#: the README's four-week plan: the table between these two lines
PLAN_START = "<!-- the plan's table: written by tools/course_time.py --write -->"
PLAN_END = "<!-- end of the plan's table -->"
QUIZ_TITLE = QUIZ_HEADING.lstrip("# ")


@dataclass(frozen=True)
class Part:
    """What one part of a notebook (a cell, its core, or its deep dives together) asks of a
    learner."""

    #: words of markdown prose, solution blocks excepted
    words: int = 0
    #: lines of code a learner reads
    code_lines: int = 0
    #: per exercise: (lines of its worked solution new to the learner, lines an earlier notebook's
    #: core solutions hold)
    exercise_lines: tuple[tuple[int, int], ...] = ()
    #: exercises whose worked solution runs the model or an optimiser
    integration: int = 0
    #: figures, tables and widgets shown
    displays: int = 0
    #: print calls in the cells a learner reads
    prints: int = 0
    #: questions to answer before running or opening the answer
    predictions: int = 0
    #: answers of the closing questions
    quiz_answers: int = 0
    #: CPU seconds of the notebook's runs (the course map's CPU time; the core carries them)
    run_seconds: float = 0.0

    def components(self) -> dict[str, float]:
        """Minutes per activity, by the rates above."""
        exercises = sum((EXERCISE_BASE_MIN if new else REUSED_EXERCISE_BASE_MIN)
                        + EXERCISE_MIN_PER_LINE * new
                        + REUSED_MIN_PER_LINE * reused for new, reused in self.exercise_lines)
        return {"prose": self.words / READING_WORDS_PER_MIN,
                "code": self.code_lines / CODE_LINES_PER_MIN,
                "outputs": DISPLAY_MIN * self.displays + PRINT_MIN * self.prints,
                "predict": PREDICTION_MIN * self.predictions,
                "quiz": QUIZ_ANSWER_MIN * self.quiz_answers,
                "exercises": exercises + INTEGRATION_EXERCISE_MIN * self.integration,
                "waiting": RUN_WAITS * self.run_seconds / 60}

    @property
    def minutes(self) -> float:
        """The estimated minutes, by the rates above."""
        return sum(self.components().values())

    def __add__(self, other: Part) -> Part:
        return Part(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class CellPart:
    """One cell's place in its notebook, and what it asks."""

    #: the `##` section it sits in ("(top)" before the first)
    section: str
    #: whether it belongs to a deep dive
    deep: bool
    part: Part
    #: the title of the deep dive it belongs to (after "Deep dive: "), None on the core
    dive: str | None = None
    #: the title of the core `##`/`###` heading it opens, where a second sitting may start
    opens: str | None = None


def solution_statements(code: str) -> list[str]:
    """The statements a learner writes in a worked solution, whitespace normalised: its lines minus
    blanks, comments (a trailing one included), `def` lines and docstrings."""
    body = re.sub(r'("""|\'\'\').*?\1', "", code, flags=re.DOTALL)
    lines = (" ".join(line.split("  #", 1)[0].split()) for line in body.splitlines())
    return [line for line in lines if line and not line.startswith(("#", "def ", "@"))]


def solution_lines(code: str) -> int:
    """How many statements a learner writes in a worked solution (`solution_statements`)."""
    return len(solution_statements(code))


def _is_read(source: str, tags: tuple[str, ...]) -> bool:
    """Whether a learner reads a code cell (not a stub, a check, a hidden claim check, the
    set-up)."""
    if "claim-check" in tags or re.search(r"^# EXERCISE \d+", source, re.MULTILINE):
        return False
    if "exercise_check(" in source or re.search(r"^def check_", source, re.MULTILINE):
        return False
    return not source.startswith("#@title Set up the course")


def shown(source: str) -> tuple[int, int]:
    """(figures, tables and widgets shown; print calls) of a code cell a learner reads:
    `display(...)`, `.show(...)` and live figures, plus what a cell's last statement shows
    (`_LAST_EXPRESSION`)."""
    displays = len(_DISPLAY_CALL.findall(source))
    statements = re.split(r"\n(?=\S)", source.strip())  # top-level statements, continuations kept
    last = next((s for s in reversed(statements) if not s.startswith(("#", "%", "!"))), "")
    displays += bool(_LAST_EXPRESSION.match(last.split("  #", 1)[0].strip()))
    return displays, len(_PRINT_CALL.findall(source))


def _markdown_part(source: str, quiz: bool, earlier: set[str]) -> tuple[Part, list[str]]:
    """What a markdown cell asks, and its solutions' statements."""
    exercises, statements, integration = [], [], 0
    for _, code in _SOLUTION_CODE.findall(source):
        lines = solution_statements(code)
        reused = sum(1 for line in lines if line in earlier)
        exercises.append((len(lines) - reused, reused))
        integration += bool(_RUNS_MODEL.search(code))
        statements += lines
    answers = source.count(ANSWER_SUMMARY)
    predictions = 0 if quiz else answers or int(bool(_PREDICT.search(_SOLUTION.sub(" ", source))))
    prose = _TIME_LINE.sub(" ", _SOLUTION.sub(" ", source))  # the time line: not read, and no loop
    return Part(words=len(prose.split()), exercise_lines=tuple(exercises),
                integration=integration, predictions=predictions,
                quiz_answers=answers if quiz else 0), statements


def _code_part(cell: Cell) -> Part:
    """What a code cell asks: reading it and what it shows."""
    if not _is_read(cell.source, cell.tags):
        return Part()
    displays, prints = shown(cell.source)
    return Part(code_lines=sum(1 for line in cell.source.splitlines() if line.strip()),
                displays=displays, prints=prints)


def cell_parts_of(cells: Sequence[Cell], earlier: set[str]) -> list[CellPart]:
    """A `CellPart` for each cell; `earlier`: the core solution statements of the notebooks before
    (this one's core solutions are added to it afterwards)."""
    result, section, written, dive, level = [], "(top)", set(), None, None
    for cell, deep in zip(cells, in_deep_dive(cells), strict=True):
        found = heading(cell.source) if cell.kind == "markdown" else None
        section = found[1] if found is not None and found[0] == 2 else section
        if found is not None and level is not None and found[0] <= level:
            dive, level = None, None
        if deep and dive is None and found is not None:
            dive, level = found[1].removeprefix("Deep dive: "), found[0]
        if cell.kind == "markdown":
            part, statements = _markdown_part(cell.source, section == QUIZ_TITLE, earlier)
            written |= set(statements) if not deep else set()
        else:
            part = _code_part(cell)
        opens = (found[1] if found is not None and found[0] in (2, 3) and not deep
                 and not found[1].startswith(("Summary", QUIZ_TITLE)) else None)
        result.append(CellPart(section, deep, part, dive if deep else None, opens))
    earlier |= written
    return result


def cell_parts(path: Path, earlier: set[str]) -> list[CellPart]:
    """`cell_parts_of` a stored notebook."""
    return cell_parts_of(as_cells(nbformat.read(path, as_version=4).cells), earlier)


def second_sitting(cells: Sequence[CellPart], core_minutes: float) -> str | None:
    """Where a core of more than SITTING_MIN (stated) minutes breaks into two sittings: the core
    `##`/`###` heading with core minutes before it nearest half of them; None for a shorter core."""
    if rounded(core_minutes) <= SITTING_MIN:
        return None
    before, best = 0.0, None
    for cell in cells:
        if cell.opens is not None and before > 0:
            gap = abs(before - core_minutes / 2)
            best = (gap, cell.opens) if best is None or gap < best[0] else best
        before += 0.0 if cell.deep else cell.part.minutes
    return best[1] if best else None


def notebooks(prefixes: list[str] | None = None) -> list[Path]:
    """The course's notebooks, in order, those starting with one of `prefixes` when given."""
    found = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in found
            if not prefixes or any(p.name.startswith(prefix) for prefix in prefixes)]


def rounded(minutes: float) -> int:
    """Minutes as the course map states them: to the nearest 5."""
    return int(5 * round(minutes / 5))


def cpu_seconds(text: str) -> dict[str, float]:
    """Notebook number -> CPU seconds of its runs, as the README's course map states them."""
    return {row[1]: float(row[5]) * (60 if row[6] == "min" else 1) for row in _ROW.findall(text)}


@dataclass(frozen=True)
class Estimate:
    """One notebook's estimate."""

    core: Part
    deep: Part
    #: where its second sitting starts (None: the core fits one)
    sitting: str | None
    #: the minutes of each deep dive, by title
    dives: dict[str, float]


def estimate(path: Path, earlier: set[str] | None = None, seconds: float | None = None) -> Estimate:
    """One stored notebook's estimate. `earlier`: as in `cell_parts_of` (by default the core
    solution statements of the course's notebooks before it); `seconds`: its CPU time (by default
    the README's)."""
    if earlier is None:
        earlier = set()
        for before in notebooks():
            if before.name >= path.name:
                break
            cell_parts(before, earlier)
    if seconds is None:
        seconds = cpu_seconds(README.read_text(encoding="utf-8")).get(path.name[:2], 0.0)
    return estimate_cells(cell_parts(path, earlier), seconds)


def estimate_cells(cells: Sequence[CellPart], seconds: float = 0.0) -> Estimate:
    """The estimate of a notebook's cells (`cell_parts_of`) whose runs take `seconds` of CPU."""
    core = sum((c.part for c in cells if not c.deep), Part(run_seconds=seconds))
    deep = sum((c.part for c in cells if c.deep), Part())
    dives: dict[str, float] = {}
    for cell in cells:
        if cell.dive is not None:
            dives[cell.dive] = dives.get(cell.dive, 0.0) + cell.part.minutes
    return Estimate(core, deep, second_sitting(cells, core.minutes), dives)


def parts(path: Path, earlier: set[str] | None = None) -> tuple[Part, Part]:
    """(core, deep dives) of one stored notebook, as `estimate` gives them."""
    found = estimate(path, earlier)
    return found.core, found.deep


def time_line(core: int, deep: int, sitting: str | None = None) -> str:
    """The header's line stating a notebook's minutes, and, for a core over SITTING_MIN minutes,
    the heading its second sitting starts from (up to a colon: "7. Reusing a batch")."""
    sittings = ("" if sitting is None
                else f", in two sittings (the second from *{sitting.split(': ', 1)[0]}*)")
    return (f"**Time:** about {core} min for the core{sittings}; the deep dives add about {deep} "
            "min.")


def essential_minutes(number: str, dives: dict[str, float]) -> tuple[float, list[str]]:
    """(minutes, titles) of notebook `number`'s essential deep dives; raises KeyError naming one
    that is not a deep dive of it."""
    titles = []
    for start in ESSENTIAL_DEEP_DIVES.get(number, ()):
        matched = [title for title in dives if title.startswith(start)]
        if len(matched) != 1:
            raise KeyError(f"notebook {number}: ESSENTIAL_DEEP_DIVES names {start!r}, which "
                           f"matches {len(matched)} of its deep dives ({sorted(dives)})")
        titles.append(matched[0])
    return sum(dives[title] for title in titles), titles


def plan_table(estimates: dict[str, Estimate]) -> str:
    """The README's four-week plan: per week its notebooks, their essential deep dives and hours."""
    rows = ["| week | topic | notebooks | essential deep dives | hours: core + essential deep "
            "dives |", "|---|---|---|---|---|"]
    for week, topic, numbers in PLAN:
        core = sum(rounded(estimates[n].core.minutes) for n in numbers)
        essential, named = 0, []
        for number in numbers:
            minutes, titles = essential_minutes(number, estimates[number].dives)
            essential += rounded(minutes)
            named += [f"{number}: " + ", ".join(f"*{title}*" for title in titles)] if titles else []
        rows.append(f"| {week} | {topic} | {', '.join(numbers)} | {'; '.join(named) or 'none'} | "
                    f"{(core + essential) / 60:.1f} h: {core / 60:.1f} + {essential / 60:.1f} |")
    return "\n".join(rows)


def stated_plan(text: str) -> str | None:
    """The plan's table as the README states it (None when it has no such table)."""
    match = re.search(re.escape(PLAN_START) + r"\n(.*?)\n" + re.escape(PLAN_END), text, re.DOTALL)
    return match.group(1) if match else None


def readme_minutes(text: str) -> dict[str, tuple[int, int]]:
    """Notebook number -> (core, deep-dive) minutes as the README's course map states them."""
    return {row[1]: (int(row[2]), int(row[3])) for row in _ROW.findall(text)}


def header_minutes(path: Path) -> str | None:
    """The time line of a stored notebook's first cell (None when it has none)."""
    match = _TIME_LINE.search(nbformat.read(path, as_version=4).cells[0].source)
    return match.group(0) if match else None


def stated(estimates: dict[str, Estimate]) -> dict[str, tuple[int, int]]:
    """Notebook number -> (core, deep-dive) minutes, rounded as the course map states them."""
    return {n: (rounded(e.core.minutes), rounded(e.deep.minutes)) for n, e in estimates.items()}


def write(estimates: dict[str, Estimate]) -> None:
    """State `estimates` in the README's course map and plan, and in each source's header."""
    measured = stated(estimates)
    text = _ROW.sub(lambda m: f"{m[1]}{measured[m[2]][0]} min core + {measured[m[2]][1]} min deep "
                    f"dives{m[5]}" if m[2] in measured else m[0],
                    README.read_text(encoding="utf-8"))
    if len(estimates) == len(notebooks()):
        block = re.compile(re.escape(PLAN_START) + r"\n.*?\n" + re.escape(PLAN_END), re.DOTALL)
        table = plan_table(estimates)
        text = block.sub(lambda _: f"{PLAN_START}\n{table}\n{PLAN_END}", text, count=1)
    README.write_text(text, encoding="utf-8")
    for source in sorted(SOURCE_DIR.glob("[0-9][0-9]_*.py")):
        if source.name[:2] in measured:
            code = source.read_text(encoding="utf-8")
            line = time_line(*measured[source.name[:2]], estimates[source.name[:2]].sitting)
            source.write_text(_TIME_LINE.sub(lambda _, line=line: "# " + line, code, count=1),
                              encoding="utf-8")


def problems(estimates: dict[str, Estimate]) -> list[str]:
    """Where the README's course map or plan, or a stored notebook's header, states other
    minutes."""
    text = README.read_text(encoding="utf-8")
    found, says = [], readme_minutes(text)
    for number, minutes in stated(estimates).items():
        if says.get(number) != minutes:
            found.append(f"README course map, notebook {number}: states {says.get(number)}, the "
                         f"notebook measures {minutes} (core, deep)")
        path = next(iter(notebooks([number])))
        expected = time_line(*minutes, estimates[number].sitting)
        if header_minutes(path) != expected:
            found.append(f"notebook {number}'s header states {header_minutes(path)!r}, expected "
                         f"{expected!r}")
    if len(estimates) == len(notebooks()):
        try:
            table = plan_table(estimates)
        except KeyError as error:
            return [*found, error.args[0]]
        if stated_plan(text) != table:
            found.append(f"README's four-week plan states\n{stated_plan(text)}\nexpected\n{table}")
    return found


def executed_outputs(path: Path) -> dict[bool, tuple[int, int, int, int]]:
    """Per part (False: the core, True: the deep dives) of an executed notebook: (figures and
    tables it shows, lines it prints; the `shown` counts of the same cells: displays, print calls).
    Only for comparing the counts with a run (`--executed`); the stated minutes never read a run."""
    cells = nbformat.read(path, as_version=4).cells
    found = {False: [0, 0, 0, 0], True: [0, 0, 0, 0]}
    for cell, deep in zip(cells, in_deep_dive(as_cells(cells)), strict=True):
        tags = tuple(cell.metadata.get("tags", []))
        if cell.cell_type != "code" or not _is_read(cell.source, tags):
            continue
        counts = found[deep]
        counts[2:] = [a + b for a, b in zip(counts[2:], shown(cell.source), strict=True)]
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if output.output_type == "stream":
                counts[1] += len(output.text.strip().splitlines())
            elif {"text/html", "image/png", "application/vnd.plotly.v1+json"} & set(data):
                counts[0] += 1  # a figure or a table (a progress bar's widget is neither)
            elif "text/plain" in data and "application/vnd.jupyter.widget-view+json" not in data:
                counts[1] += len(data["text/plain"].splitlines())
    return {deep: tuple(counts) for deep, counts in found.items()}


def _report(path: Path, found: Estimate, sections: list[CellPart] | None) -> None:
    """Print one notebook's row (and, given its cells, its sections')."""
    parts_ = found.core.components()
    print(f"{path.stem:<24} {found.core.minutes:5.0f} {found.deep.minutes:5.0f}  "
          + " ".join(f"{parts_[key]:5.0f}" for key in parts_)
          + (f"  break: {found.sitting}" if found.sitting else ""))
    for name in dict.fromkeys(c.section for c in sections or ()):
        for flag, label in ((False, "core"), (True, "deep")):
            minutes = sum((c.part for c in sections if c.section == name and c.deep == flag),
                          Part()).minutes
            if minutes >= 0.5:
                print(f"    {label} {minutes:5.0f}  {name[:70]}")


def _compare_outputs(folder: Path, estimates: dict[str, Estimate]) -> None:
    """Print, per executed notebook in `folder`, its outputs beside the counts the estimate uses."""
    print("outputs, core (deep): shown by the run (figures and tables, printed lines) against "
          "counted (displays, print calls)")
    for number in estimates:
        for path in sorted(folder.glob(f"{number}_*.ipynb")):
            got = executed_outputs(path)
            print(f"  {path.stem:<22} " + "   ".join(
                f"{label} {c[0]:3} {c[1]:4} vs {c[2]:3} {c[3]:3}"
                for label, c in (("core", got[False]), ("deep", got[True]))))


@one_line_interrupt("tools/course_time.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="notebook name prefixes, e.g. 05")
    parser.add_argument("--check", action="store_true",
                        help="fail when the README or a header states other minutes")
    parser.add_argument("--sections", action="store_true",
                        help="also the minutes of each ## section")
    parser.add_argument("--write", action="store_true",
                        help="state the minutes in the headers and the README")
    parser.add_argument("--executed", type=Path, metavar="DIR",
                        help="also compare the counted outputs with those of the executed "
                             "notebooks in DIR (e.g. build/executed, where the notebook tests "
                             "leave them)")
    args = parser.parse_args(argv)
    # a prefix no notebook has would print a table of nothing, totalling 0.0 hours
    names = [path.name for path in notebooks()]
    unmatched = [p for p in args.prefixes if not any(name.startswith(p) for name in names)]
    if unmatched:
        print(f"course_time: error: no notebook name starts with "
              f"{', '.join(map(repr, unmatched))}; the notebooks are "
              f"{', '.join(name.removesuffix('.ipynb') for name in names)}", file=sys.stderr)
        return 2
    # a missing folder would print the comparison's header and no row, as if the run showed nothing
    if args.executed is not None and not args.executed.is_dir():
        print(f"course_time: error: --executed {args.executed} "
              f"{'is not a folder' if args.executed.exists() else 'does not exist'}; give the "
              "folder of executed notebooks (e.g. build/executed)", file=sys.stderr)
        return 2
    estimates, earlier = {}, set()
    seconds = cpu_seconds(README.read_text(encoding="utf-8"))
    print(f"{'notebook':<24} {'core':>5} {'deep':>5}  core minutes by activity: "
          + " ".join(Part().components()))
    for path in notebooks():
        cells = cell_parts(path, earlier)  # adds its core solutions to `earlier` for the next ones
        found = estimate_cells(cells, seconds.get(path.name[:2], 0.0))
        if args.prefixes and not any(path.name.startswith(prefix) for prefix in args.prefixes):
            continue
        estimates[path.name[:2]] = found
        _report(path, found, cells if args.sections else None)
    if args.executed is not None:
        _compare_outputs(args.executed, estimates)
    total = [sum(getattr(e, key).minutes for e in estimates.values()) for key in ("core", "deep")]
    print(f"{'total (hours)':<24} {total[0] / 60:5.1f} {total[1] / 60:5.1f}")
    if args.write:
        write(estimates)
        print("wrote the minutes into README.md and the notebook sources: rebuild the notebooks")
    if not args.check:
        return 0
    found = problems(estimates)
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
