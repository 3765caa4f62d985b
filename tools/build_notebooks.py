"""Build notebooks/NN_topic.ipynb from notebooks/src/NN_topic.py (a jupytext percent source).

Usage:
    python tools/build_notebooks.py          # (re)write every notebook from its source
    python tools/build_notebooks.py --check  # exit 1 if a stored notebook differs from its source
    (exit 2, writing nothing, when a source cannot be read or built, a cell has a tag not in
    KNOWN_TAGS, or a notebook's path is a link or a folder: the message names the file, the cell or
    the path)
A stored notebook is replaced without a copy only where it is a build's own: byte for byte what this
build writes, what a build recorded writing there (`rlhf_helpers.course.tool_files`: the SHA-256 in
the hidden .NN_topic.ipynb.sha256 beside it, which git ignores), or the notebook committed at git's
HEAD (a fresh clone has no records). Anything else there (a learner's edit to a cell's text, a
run's outputs, a kernel's metadata) is first copied to NN_topic.ipynb.bak-<date>-<time> beside it,
and a line says so.

A source is read by jupytext ("py:percent"): `# %%` starts a code cell, `# %% [markdown]` a markdown
cell (its lines commented). The course's own steps on top:
    # %% tags=["colab-setup"]   exactly one, left empty: becomes
                                `rlhf_helpers.course.notebook.colab_setup_source()`
    {{colab_badge}}             in markdown: this notebook's "Open in Colab" badge
    # %% tags=["claim-check"]   a cell asserting the prose's claims (`rlhf_helpers.course.claims`):
                                its source is stored collapsed (jupyter.source_hidden), and the
                                site leaves it off
    ## Deep dive: <title>       a markdown cell opening an optional deep dive
                                (rlhf_helpers.course.deep_dives): stored with
                                jp-MarkdownHeadingCollapsed, so JupyterLab shows the section folded
The comments before the first `# %%` (which jupytext reads as a first, comment-only code cell) are
dropped. Cells keep only their tags (except "colab-setup"): jupytext's layout metadata is dropped.
The output has no outputs or execution counts and stable cell ids, so rebuilding is idempotent.
notebooks/src/jupytext.toml lets JupyterLab open the sources as notebooks (Open With > Notebook) and
save them back as the same script; they are deliberately not paired with notebooks/*.ipynb, which
only this script writes.
"""

from __future__ import annotations

# ruff: noqa: E402 - run as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("tools/build_notebooks.py")

import argparse
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlhf_helpers.course.deep_dives import is_deep_dive_heading  # noqa: E402
from rlhf_helpers.course.notebook import colab_badge, colab_setup_source  # noqa: E402
from rlhf_helpers.course.tool_files import as_written, write_recorded  # noqa: E402
from rlhf_helpers.runtime.interrupt import one_line_interrupt  # noqa: E402

SOURCE_DIR = ROOT / "notebooks" / "src"
NOTEBOOK_DIR = ROOT / "notebooks"
SETUP_TAG = "colab-setup"
CLAIM_TAG = "claim-check"
#: The cell tags a source may give, and what each does; any other tag (a misspelt one) is refused.
KNOWN_TAGS = {SETUP_TAG: "the Colab set-up cell, generated here",
              CLAIM_TAG: "checks the prose's claims on the run: collapsed, and left off the site"}
_KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
#: A built notebook's own metadata: a kernel adds its language_info (the Python version) on a save.
_NOTEBOOK_METADATA = {"kernelspec": _KERNELSPEC, "language_info": {"name": "python"}}
#: The only cell metadata a build writes.
_CELL_KEYS = {"tags", "jupyter", "jp-MarkdownHeadingCollapsed"}
# Cell metadata jupytext adds to record the text layout (blank lines, `# %% [md]` spellings).
_LAYOUT_KEYS = {"lines_to_next_cell", "lines_to_end_of_cell_marker", "cell_marker", "region_name"}


def _is_preamble(cell: nbformat.NotebookNode) -> bool:
    """Whether a first cell is the comment block before the first `# %%` (with or without a
    marker)."""
    return (cell.cell_type == "code" and not set(cell.metadata) - _LAYOUT_KEYS
            and all(not line.strip() or line.startswith("#") for line in cell.source.splitlines()))


def read_cells(text: str, notebook_name: str) -> list[nbformat.NotebookNode]:
    """The cells of a percent-format source written for `notebook_name`, substitutions made.

    Raises ValueError (naming the notebook) for a cell jupytext could not map to code or markdown
    with tags, and unless there is exactly one empty code cell tagged "colab-setup"."""
    cells = jupytext.reads(text, fmt="py:percent").cells
    if cells and _is_preamble(cells[0]):
        cells = cells[1:]
    setup = [cell for cell in cells if SETUP_TAG in cell.metadata.get("tags", [])]
    if len(setup) != 1:
        raise ValueError(f'{notebook_name}: needs exactly one \'# %% tags=["{SETUP_TAG}"]\' cell, '
                         f'found {len(setup)}')
    if setup[0].cell_type != "code" or setup[0].source.strip():
        raise ValueError(f"{notebook_name}: the {SETUP_TAG} cell must be an empty code cell (its "
                         "code is generated)")
    result = []
    for number, cell in enumerate(cells, start=1):
        if cell.cell_type not in ("code", "markdown"):
            raise ValueError(
                f"{notebook_name}: unsupported {cell.cell_type} cell: {cell.source[:40]!r}")
        # e.g. `# %% [setup]`: jupytext reads the text after `# %%` as a title
        if "title" in cell.metadata:
            raise ValueError(
                f"{notebook_name}: unknown cell marker '# %% {cell.metadata['title']}'")
        extra = set(cell.metadata) - _LAYOUT_KEYS - {"tags"}
        if extra:
            raise ValueError(
                f"{notebook_name}: unsupported cell metadata {sorted(extra)} (only tags are kept)")
        unknown = [tag for tag in cell.metadata.get("tags", []) if tag not in KNOWN_TAGS]
        if unknown:  # a misspelt tag would be kept and do nothing
            first = next((line for line in cell.source.splitlines() if line.strip()), "")
            raise ValueError(
                f"{notebook_name}: cell {number} ({first[:40]!r}) has the unknown tag "
                f"{unknown[0]!r}; the known tags are {', '.join(sorted(KNOWN_TAGS))}")
        tags = [tag for tag in cell.metadata.get("tags", []) if tag != SETUP_TAG]
        source = cell.source
        if cell is setup[0]:
            source = colab_setup_source()
        elif cell.cell_type == "markdown":
            source = source.replace("{{colab_badge}}", colab_badge(notebook_name))
        if CLAIM_TAG in tags and cell.cell_type != "code":
            raise ValueError(f"{notebook_name}: a {CLAIM_TAG} cell must be code: {source[:40]!r}")
        new = (nbformat.v4.new_markdown_cell if cell.cell_type == "markdown"
               else nbformat.v4.new_code_cell)
        metadata = {"tags": tags} if tags else {}
        # collapsed in JupyterLab: the learner reads the claim, not its assertion
        if CLAIM_TAG in tags:
            metadata["jupyter"] = {"source_hidden": True}
        # optional: JupyterLab shows it folded
        if cell.cell_type == "markdown" and is_deep_dive_heading(source):
            metadata["jp-MarkdownHeadingCollapsed"] = True
        result.append(new(source, metadata=metadata))
    return result


def read_source(source: Path) -> str:
    """A source's text: UTF-8, a byte order mark at its start dropped (an editor's, not code: kept,
    it would start the first cell and break its first line). ValueError naming the file and line for
    a byte that is not UTF-8, or for a path that is no regular file (a named pipe would block the
    read for ever)."""
    if not source.is_file():
        raise ValueError(f"{source.name} is not a regular file: put the notebook's source there")
    data = source.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{source.name}, line {line}: not valid UTF-8 ({error.reason}); "
                         "save the file as UTF-8") from None


def cell_id(notebook_name: str, index: int) -> str:
    """The id a build gives the notebook's cell number `index` (from 0): stable across builds."""
    return hashlib.sha1(f"{notebook_name}:{index}".encode()).hexdigest()[:8]


def build_notebook(source: Path) -> nbformat.NotebookNode:
    """The notebook built from one source file (no outputs, stable ids, no jupytext metadata)."""
    name = source.with_suffix(".ipynb").name
    nb = nbformat.v4.new_notebook()
    nb.metadata = {key: dict(value) for key, value in _NOTEBOOK_METADATA.items()}
    for index, cell in enumerate(read_cells(read_source(source), name)):
        cell.id = cell_id(name, index)
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The notebook as stored on disk (nbformat's JSON with a trailing newline)."""
    return nbformat.writes(nb) + "\n"


def sources(source_dir: Path | None = None) -> list[Path]:
    """Every notebook source in `source_dir` (default SOURCE_DIR), in course order."""
    return sorted((source_dir or SOURCE_DIR).glob("[0-9]*.py"))


def write_new(target: Path, text: str) -> None:
    """Write `text` as a new file put in place at `target` (a temporary file in the same folder,
    renamed over `target`), and record its SHA-256 beside it (`tool_files.write_recorded`): the next
    build knows it for its own. Never written through a link: a symbolic link (put there since the
    check) or a hard link's other name keeps what it held, and a build stopped half-way leaves the
    old notebook whole."""
    write_recorded(target, text.encode("utf-8"))


def committed(target: Path) -> bytes | None:
    """The notebook at `target` as git's HEAD has it (checked out: line endings as in the work
    tree), or None: no git, no work tree there, or no such file at HEAD."""
    try:
        shown = subprocess.run(["git", "-C", str(target.parent), "cat-file", "--filters",
                                f"HEAD:./{target.name}"], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return shown.stdout if shown.returncode == 0 else None


def builds_own(target: Path, text: str) -> bool:
    """Whether the notebook at `target` is a build's, which a build may replace without a copy:
    `text` itself (what this build writes), the bytes a build recorded writing there, or the
    notebook committed at HEAD (written before builds kept records, or checked out since)."""
    data = target.read_bytes()
    return data == text.encode("utf-8") or bool(as_written(target)) or data == committed(target)


def person_made(target: Path) -> str | None:
    """What the notebook at `target` holds that no build writes, which a copy of it keeps
    ("outputs", "metadata a kernel or an editor wrote", ...), or None where its metadata, outputs,
    cell ids and cell metadata are all a build's (its cells' text may still be a person's: that
    `builds_own` tells)."""
    try:
        nb = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError too
        return "no notebook a build wrote"
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list) or not all(isinstance(cell, dict) for cell in cells):
        return "no notebook a build wrote"
    if nb.get("metadata") != _NOTEBOOK_METADATA:
        return "metadata a kernel or an editor wrote"
    if any(cell.get("outputs") or cell.get("execution_count") is not None for cell in cells):
        return "outputs"
    if [cell.get("id") for cell in cells] != [cell_id(target.name, i) for i in range(len(cells))]:
        return "cells added, moved or removed by an editor"
    metadata = [cell.get("metadata", {}) for cell in cells]
    if any(not isinstance(entry, dict) or set(entry) - _CELL_KEYS for entry in metadata):
        return "cell metadata an editor wrote"
    return None


def keep_copy(target: Path) -> Path:
    """Copy `target` to a new `NAME.bak-<date>-<time>` beside it (never over an earlier copy);
    returns the copy's path."""
    data, stamp = target.read_bytes(), time.strftime("%Y%m%d-%H%M%S")
    for number in itertools.count():
        copy = target.with_name(f"{target.name}.bak-{stamp}" + (f"-{number}" if number else ""))
        try:
            with open(copy, "xb") as stream:  # "x": fails where a copy of that name is
                stream.write(data)
        except FileExistsError:
            continue
        shutil.copystat(target, copy)
        return copy
    raise AssertionError("unreachable")


def target_problem(target: Path) -> str | None:
    """Why the built notebook cannot be written at `target` (a link, a folder or another file that
    is not a regular one, such as a named pipe, which a read would wait on for ever), or None."""
    if target.is_symlink():  # writing would change the file it points to, wherever that is
        return (f"{target} is a link (to {os.readlink(target)}), not a notebook file: remove the "
                "link")
    if target.is_dir():
        return f"{target} is a folder, not a notebook file: move it away"
    if target.exists() and not target.is_file():
        return f"{target} is not a regular file (a named pipe or a device?): move it away"
    return None


def build_all(source_dir: Path | None = None, notebook_dir: Path | None = None,
              check: bool = False) -> int:
    """Build every source of `source_dir` (default SOURCE_DIR) into `notebook_dir` (NOTEBOOK_DIR);
    `check`: only compare. The exit status: 0 done, 1 a stored notebook differs (`check`), 2 nothing
    written (one line on stderr): a source cannot be read or built, or a notebook's path is a
    link or a folder (every path is checked before any notebook is written)."""
    notebook_dir = notebook_dir or NOTEBOOK_DIR
    # every source is read and built before any notebook is written: a bad one changes nothing
    built = {}
    for source in sources(source_dir):
        try:
            built[notebook_dir / source.with_suffix(".ipynb").name] = render(build_notebook(source))
        except (ValueError, nbformat.ValidationError) as error:
            print(f"build_notebooks: error: {error} (no notebook was written)", file=sys.stderr)
            return 2
    # a link is only refused for writing: --check reads through it, to a regular file only
    problems = [problem for target in built if (problem := target_problem(target))
                and (not check or (target.exists() and not target.is_file()))]
    if problems:
        print(f"build_notebooks: error: {problems[0]} (no notebook was written)", file=sys.stderr)
        return 2
    stale = []
    for target, text in built.items():
        if check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            # a person's work there (a run's outputs, their edits) is kept beside it, said in a line
            if target.exists() and not builds_own(target, text):
                held = person_made(target) or "edited cells"
                copy = keep_copy(target)
                print(f"kept {target.name} as {copy.name}: it held {held}, which no build "
                      "writes (notebooks/*.ipynb are built from notebooks/src/)")
            write_new(target, text)
            print(f"wrote {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
    if stale:
        print("out of date (run `python tools/build_notebooks.py`): " + ", ".join(stale))
        return 1
    return 0


@one_line_interrupt("tools/build_notebooks.py", "run it again to write every notebook")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a notebook is out of date")
    args = parser.parse_args(argv)
    return build_all(check=args.check)


if __name__ == "__main__":
    raise SystemExit(main())
