"""A notebook's core path and its optional deep dives, read from its markdown headings.

A deep dive starts at a markdown cell whose first line is `## Deep dive: <title>` (or `###` inside a
section) and whose next paragraph is DEEP_DIVE_NOTE; it runs until the next heading of the same or a
higher level. A learner on the core path skips it, so nothing after it may use a name that only a
deep dive defines (`names_only_deep_dives_define`, checked by tests/course/test_deep_dives.py).
JupyterLab shows its heading collapsed (tools/build_notebooks.py sets
`jp-MarkdownHeadingCollapsed`).

Each notebook ends with QUIZ_HEADING: three to five questions, each answer in a collapsed
`<details><summary>Answer</summary>` block. Standard library only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass

#: the second paragraph of every deep dive's heading cell, word for word
DEEP_DIVE_NOTE = "*Optional: skip it on a first pass; nothing after it needs it.*"
#: the heading of each notebook's closing questions
QUIZ_HEADING = "## Check your understanding"
#: how a collapsed answer to one of those questions starts
ANSWER_SUMMARY = "<summary>Answer</summary>"
_HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")
_DEEP_DIVE = re.compile(r"^Deep dive: \S")


@dataclass(frozen=True)
class Cell:
    """What the core/deep-dive split reads of a notebook cell."""

    #: "markdown" or "code"
    kind: str
    #: the cell's text
    source: str
    #: the cell's tags ("claim-check", ...)
    tags: tuple[str, ...] = ()


def as_cells(notebook_cells: Sequence[object]) -> list[Cell]:
    """Cells of an nbformat notebook (or any objects with cell_type, source and metadata) as
    `Cell`s."""
    return [Cell(cell.cell_type, cell.source, tuple(cell.metadata.get("tags", [])))
            for cell in notebook_cells]


def heading(source: str) -> tuple[int, str] | None:
    """(level, title) of a markdown cell's first line when it is a heading, else None."""
    match = _HEADING.match(source.split("\n", 1)[0])
    return (len(match.group(1)), match.group(2)) if match else None


def is_deep_dive_heading(source: str) -> bool:
    """Whether a markdown cell opens a deep dive (its first line is `## Deep dive: ...` or
    `### ...`)."""
    found = heading(source)
    return found is not None and found[0] in (2, 3) and _DEEP_DIVE.match(found[1]) is not None


def in_deep_dive(cells: Sequence[Cell]) -> list[bool]:
    """Per cell: whether it belongs to a deep dive (its heading cell included)."""
    inside, level = [], None  # level: the open deep dive's heading level
    for cell in cells:
        found = heading(cell.source) if cell.kind == "markdown" else None
        if found is not None and level is not None and found[0] <= level:
            level = None  # a heading of the same or a higher level ends the deep dive
        if cell.kind == "markdown" and level is None and is_deep_dive_heading(cell.source):
            level = found[0]
        inside.append(level is not None)
    return inside


def bad_deep_dive_notes(cells: Sequence[Cell]) -> list[str]:
    """The titles of deep dives whose heading cell does not carry DEEP_DIVE_NOTE as its next
    paragraph."""
    bad = []
    for cell in cells:
        if cell.kind == "markdown" and is_deep_dive_heading(cell.source):
            paragraphs = [p.strip() for p in cell.source.split("\n\n")]
            if len(paragraphs) < 2 or paragraphs[1] != DEEP_DIVE_NOTE:
                bad.append(heading(cell.source)[1])
    return bad


def _python(source: str) -> ast.Module:
    """A code cell's AST, IPython magics and shell lines (`%...`, `!...`) dropped."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    return ast.parse("\n".join(lines))


def bound_and_used(source: str) -> tuple[set[str], set[str]]:
    """(names a code cell binds anywhere, names it reads that it does not bind itself)."""
    bound, used = set(), set()
    for node in ast.walk(_python(source)):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return bound, used - bound


def names_only_deep_dives_define(cells: Sequence[Cell]) -> list[tuple[int, str]]:
    """(cell index, name) for each core code cell that reads a name which, at that point, only a
    deep dive has defined: skipping the deep dives would break that cell."""
    inside, core, deep, broken = in_deep_dive(cells), set(), set(), []
    for index, (cell, skipped) in enumerate(zip(cells, inside, strict=True)):
        if cell.kind != "code":
            continue
        bound, used = bound_and_used(cell.source)
        if skipped:
            deep |= bound
            continue
        broken += [(index, name) for name in sorted(used & (deep - core))]
        core |= bound
    return broken


def quiz_answers(cells: Sequence[Cell]) -> int | None:
    """How many collapsed answers the QUIZ_HEADING section holds (None when the notebook has no such
    section)."""
    start = next((i for i, c in enumerate(cells)
                  if c.kind == "markdown" and c.source.startswith(QUIZ_HEADING)), None)
    if start is None:
        return None
    level = heading(cells[start].source)[0]
    count = 0
    for cell in cells[start:]:
        found = heading(cell.source) if cell.kind == "markdown" else None
        if cell is not cells[start] and found is not None and found[0] <= level:
            break
        count += cell.source.count(ANSWER_SUMMARY) if cell.kind == "markdown" else 0
    return count
