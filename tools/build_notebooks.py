"""Build notebooks/NN_topic.ipynb from notebooks/src/NN_topic.py (percent-format sources).

Usage:
    python tools/build_notebooks.py            # (re)write every notebook from its source
    python tools/build_notebooks.py --check    # exit 1 if a stored notebook differs from its source

Source format (a subset of jupytext's "percent" format, parsed here so no extra package is needed):
    # %% [markdown]        a markdown cell; each line's leading "# " (or "#") is removed
    # %%                   a code cell, kept verbatim
    # %% [setup]           the standard Colab set-up cell, `rlhf_helpers.course.notebook.colab_setup_source()`
In markdown, the placeholder {{colab_badge}} becomes this notebook's "Open in Colab" badge.
Text before the first "# %%" marker (e.g. a module comment) is ignored.
The output has no outputs or execution counts and stable cell ids, so rebuilding is idempotent.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlhf_helpers.course.notebook import colab_badge, colab_setup_source  # noqa: E402

SOURCE_DIR = ROOT / "notebooks" / "src"
NOTEBOOK_DIR = ROOT / "notebooks"
_MARKER = re.compile(r"^# %%(?: \[(\w+)\])?\s*$")
_KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def _uncomment(line: str) -> str:
    if line.startswith("# "):
        return line[2:]
    if line.startswith("#"):
        return line[1:]
    raise ValueError(f"markdown line must start with '#', got {line!r}")


def parse_cells(text: str, notebook_name: str) -> list[tuple[str, str]]:
    """(cell_type, source) pairs of a percent-format source written for `notebook_name`."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        match = _MARKER.match(line)
        if match:
            kind = match.group(1) or "code"
            if kind not in ("code", "markdown", "setup"):
                raise ValueError(f"{notebook_name}: unknown cell kind [{kind}]")
            cells.append((kind, []))
        elif cells:
            cells[-1][1].append(line)
    result = []
    for kind, lines in cells:
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if kind == "setup":
            result.append(("code", colab_setup_source()))
        elif kind == "markdown":
            body = "\n".join(_uncomment(line) if line.strip() else "" for line in lines)
            result.append(("markdown", body.replace("{{colab_badge}}", colab_badge(notebook_name))))
        else:
            result.append(("code", "\n".join(lines)))
    if not result:
        raise ValueError(f"{notebook_name}: the source has no '# %%' cells")
    return result


def build_notebook(source: Path) -> nbformat.NotebookNode:
    """The notebook built from one source file (no outputs, stable ids)."""
    name = source.with_suffix(".ipynb").name
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(_KERNELSPEC), "language_info": {"name": "python"}}
    for index, (kind, text) in enumerate(parse_cells(source.read_text(encoding="utf-8"), name)):
        cell_id = hashlib.sha1(f"{name}:{index}".encode()).hexdigest()[:8]
        if kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(text, id=cell_id)
        else:
            cell = nbformat.v4.new_code_cell(text, id=cell_id)
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The notebook as stored on disk (nbformat's JSON with a trailing newline)."""
    return nbformat.writes(nb) + "\n"


def sources() -> list[Path]:
    """Every notebook source, in course order."""
    return sorted(SOURCE_DIR.glob("[0-9]*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a notebook is out of date")
    args = parser.parse_args(argv)
    stale = []
    for source in sources():
        target = NOTEBOOK_DIR / source.with_suffix(".ipynb").name
        text = render(build_notebook(source))
        if args.check:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    if stale:
        print("out of date (run `python tools/build_notebooks.py`): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
