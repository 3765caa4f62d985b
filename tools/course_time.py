"""How long each notebook's core path and deep dives take a learner: the README's course-map times.

Usage:
    python tools/course_time.py          # a table of core and deep-dive minutes, and the counts
    python tools/course_time.py 05 07    # only the notebooks whose names start with these prefixes
    python tools/course_time.py --write  # state the minutes in each header and the README's map
    python tools/course_time.py --check  # exit 1 when a header or the README's map states others

The minutes are an estimate, made the same way for every notebook from what it contains, counted in
the stored notebook (core and deep dives split by `rlhf_helpers.course.deep_dives`):
- prose: the markdown's words (solution blocks excepted), read at READING_WORDS_PER_MIN;
- code: the lines of the code cells a learner reads (not the exercise stubs, the checks, the hidden
  claim checks or the Colab set-up cell), at CODE_LINES_PER_MIN;
- exercises: EXERCISE_BASE_MIN each, plus EXERCISE_MIN_PER_LINE per line of its worked solution (the
  statements a learner writes, not the signature, the docstring or comments); a line an earlier
  notebook's solutions already hold counts REUSED_MIN_PER_LINE (and an exercise made only of such
  lines, REUSED_EXERCISE_BASE_MIN instead of the base).
The rates are those of a first-year PhD student working carefully through dense technical material;
they put the course as it stood before the core/deep-dive split (26k words of prose, 2.3k code lines
to read, 22 exercises) at 25 hours, inside an instructor's independent estimate of 22 to 28 hours
for it. Running the cells adds the CPU time the course map lists beside these minutes.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlhf_helpers.course.deep_dives import as_cells, heading, in_deep_dive  # noqa: E402

NOTEBOOK_DIR = ROOT / "notebooks"
README = ROOT / "README.md"
#: words of technical prose with equations read per minute, carefully (a fifth of casual reading
#: speed)
READING_WORDS_PER_MIN = 50.0
#: lines of course code read and understood per minute
CODE_LINES_PER_MIN = 5.0
#: minutes per exercise before writing anything: reading its task, the check's messages, a first
#: attempt
EXERCISE_BASE_MIN = 15.0
#: minutes per line of an exercise's worked solution: writing, running the check, fixing
EXERCISE_MIN_PER_LINE = 2.0
#: minutes per line a learner wrote before, in an earlier notebook's exercise (the same statement)
REUSED_MIN_PER_LINE = 0.5
#: minutes for an exercise made only of lines written before (pasting an earlier answer)
REUSED_EXERCISE_BASE_MIN = 5.0
_SOLUTION = re.compile(r"<details><summary>Solution \d+</summary>.*?</details>", re.DOTALL)
_SOLUTION_CODE = re.compile(r"<summary>Solution (\d+)</summary>.*?```python\n(.*?)```", re.DOTALL)
_ROW = re.compile(r"^(\| \[(\d\d) [^|]*\]\([^)]*\) \|.*\| )(\d+) min core \+ (\d+) min deep dives( "
                  r"\|)", re.MULTILINE)
#: the header's time line, in a notebook source (`# ` before it) or a stored notebook's first cell
_TIME_LINE = re.compile(r"^(# )?\*\*Time:\*\* .*$", re.MULTILINE)
SOURCE_DIR = NOTEBOOK_DIR / "src"


def time_line(core: int, deep: int) -> str:
    """The header's line stating a notebook's minutes."""
    return f"**Time:** about {core} min for the core; the deep dives add about {deep} min."


@dataclass(frozen=True)
class Part:
    """What one part of a notebook (its core, or its deep dives together) asks of a learner."""

    #: words of markdown prose, solution blocks excepted
    words: int = 0
    #: lines of code a learner reads
    code_lines: int = 0
    #: per exercise: (lines of its worked solution new to the learner, lines an earlier notebook's
    #: solutions hold)
    exercise_lines: tuple[tuple[int, int], ...] = ()

    @property
    def minutes(self) -> float:
        """The estimated minutes, by the rates above."""
        exercises = sum((EXERCISE_BASE_MIN if new else REUSED_EXERCISE_BASE_MIN)
                        + EXERCISE_MIN_PER_LINE * new
                        + REUSED_MIN_PER_LINE * reused for new, reused in self.exercise_lines)
        return self.words / READING_WORDS_PER_MIN + self.code_lines / CODE_LINES_PER_MIN + exercises

    def __add__(self, other: Part) -> Part:
        return Part(self.words + other.words, self.code_lines + other.code_lines,
                    self.exercise_lines + other.exercise_lines)


def solution_statements(code: str) -> list[str]:
    """The statements a learner writes in a worked solution, whitespace normalised: its lines minus
    blanks, comments (a trailing one included), `def` lines and docstrings."""
    body = re.sub(r'("""|\'\'\').*?\1', "", code, flags=re.DOTALL)
    lines = (" ".join(line.split("  #", 1)[0].split()) for line in body.splitlines())
    return [line for line in lines if line and not line.startswith(("#", "def ", "@"))]


def solution_lines(code: str) -> int:
    """How many statements a learner writes in a worked solution (`solution_statements`)."""
    return len(solution_statements(code))


def _read_code(source: str, tags: tuple[str, ...]) -> int:
    """Code lines a learner reads in one code cell (0 for a stub, a check, a hidden claim check)."""
    if "claim-check" in tags or re.search(r"^# EXERCISE \d+", source, re.MULTILINE):
        return 0
    if "exercise_check(" in source or re.search(r"^def check_", source, re.MULTILINE):
        return 0
    if source.startswith("#@title Set up the course"):
        return 0
    return sum(1 for line in source.splitlines() if line.strip())


def cell_parts(path: Path, earlier: set[str]) -> list[tuple[str, bool, Part]]:
    """(section heading, in a deep dive, what the cell asks) for each cell of a stored notebook;
    `earlier`: the solution statements of the notebooks before it (this notebook's are added to
    it)."""
    cells = as_cells(nbformat.read(path, as_version=4).cells)
    result, section, written = [], "(top)", set()
    for cell, deep in zip(cells, in_deep_dive(cells), strict=True):
        found = heading(cell.source) if cell.kind == "markdown" else None
        section = found[1] if found is not None and found[0] == 2 else section
        if cell.kind == "markdown":
            exercises = []
            for _, code in _SOLUTION_CODE.findall(cell.source):
                statements = solution_statements(code)
                reused = sum(1 for line in statements if line in earlier)
                exercises.append((len(statements) - reused, reused))
                written |= set(statements)
            part = Part(words=len(_SOLUTION.sub(" ", cell.source).split()),
                        exercise_lines=tuple(exercises))
        else:
            part = Part(code_lines=_read_code(cell.source, cell.tags))
        result.append((section, deep, part))
    earlier |= written
    return result


def parts(path: Path, earlier: set[str] | None = None) -> tuple[Part, Part]:
    """(core, deep dives) of one stored notebook (`earlier`: as in `cell_parts`; by default the
    solution statements of the course's notebooks before it)."""
    if earlier is None:
        earlier = set()
        for before in notebooks():
            if before.name >= path.name:
                break
            cell_parts(before, earlier)
    core, deep = Part(), Part()
    for _, in_deep, part in cell_parts(path, earlier):
        core, deep = (core, deep + part) if in_deep else (core + part, deep)
    return core, deep


def notebooks(prefixes: list[str] | None = None) -> list[Path]:
    """The course's notebooks, in order, those starting with one of `prefixes` when given."""
    found = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in found
            if not prefixes or any(p.name.startswith(prefix) for prefix in prefixes)]


def rounded(minutes: float) -> int:
    """Minutes as the course map states them: to the nearest 5."""
    return int(5 * round(minutes / 5))


def readme_minutes(text: str) -> dict[str, tuple[int, int]]:
    """Notebook number -> (core, deep-dive) minutes as the README's course map states them."""
    return {row[1]: (int(row[2]), int(row[3])) for row in _ROW.findall(text)}


def header_minutes(path: Path) -> str | None:
    """The time line of a stored notebook's first cell (None when it has none)."""
    match = _TIME_LINE.search(nbformat.read(path, as_version=4).cells[0].source)
    return match.group(0) if match else None


def write(measured: dict[str, tuple[int, int]]) -> None:
    """State `measured` (notebook number -> minutes) in the README's course map and each source's
    header."""
    text = README.read_text(encoding="utf-8")
    README.write_text(
        _ROW.sub(lambda m: f"{m[1]}{measured[m[2]][0]} min core + {measured[m[2]][1]} min deep "
                 f"dives{m[5]}" if m[2] in measured else m[0], text), encoding="utf-8")
    for source in sorted(SOURCE_DIR.glob("[0-9][0-9]_*.py")):
        if source.name[:2] in measured:
            code = source.read_text(encoding="utf-8")
            source.write_text(
                _TIME_LINE.sub("# " + time_line(*measured[source.name[:2]]), code, count=1),
                encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="notebook name prefixes, e.g. 05")
    parser.add_argument("--check", action="store_true",
                        help="fail when the README states other minutes")
    parser.add_argument("--sections", action="store_true",
                        help="also the minutes of each ## section")
    parser.add_argument("--write", action="store_true",
                        help="state the minutes in the headers and the README")
    args = parser.parse_args(argv)
    measured, total, earlier = {}, [0.0, 0.0], set()
    print(f"{'notebook':<24} {'core min':>8} {'deep min':>8}   core: words, code lines, (new, "
          "reused) exercise lines")
    for path in notebooks():
        cells = cell_parts(path, earlier)
        if args.prefixes and not any(path.name.startswith(prefix) for prefix in args.prefixes):
            continue
        core = sum((part for _, deep, part in cells if not deep), Part())
        deep = sum((part for _, deep, part in cells if deep), Part())
        measured[path.name[:2]] = (rounded(core.minutes), rounded(deep.minutes))
        total[0], total[1] = total[0] + core.minutes, total[1] + deep.minutes
        print(f"{path.stem:<24} {core.minutes:8.0f} {deep.minutes:8.0f}   {core.words}, "
              f"{core.code_lines}, {list(core.exercise_lines)}")
        if args.sections:
            for name in dict.fromkeys(section for section, _, _ in cells):
                for flag, label in ((False, "core"), (True, "deep")):
                    here = (p for s, d, p in cells if s == name and d == flag)
                    minutes = sum(here, Part()).minutes
                    if minutes >= 0.5:
                        print(f"    {label} {minutes:5.0f}  {name[:70]}")
    print(f"{'total (hours)':<24} {total[0] / 60:8.1f} {total[1] / 60:8.1f}")
    if args.write:
        write(measured)
        print("wrote the minutes into README.md and the notebook sources: rebuild the notebooks")
    if not args.check:
        return 0
    stated = readme_minutes(README.read_text(encoding="utf-8"))
    wrong = {n: (stated.get(n), m) for n, m in measured.items() if stated.get(n) != m}
    for number, (says, should) in wrong.items():
        print(f"README course map, notebook {number}: states {says}, the notebook measures "
              f"{should} (core, deep)")
    headers = {path.name[:2]: header_minutes(path) for path in notebooks(args.prefixes)}
    stale = [n for n, line in headers.items() if n in measured and line != time_line(*measured[n])]
    for number in stale:
        print(f"notebook {number}'s header states {headers[number]!r}, expected "
              f"{time_line(*measured[number])!r}")
    return 1 if wrong or stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
