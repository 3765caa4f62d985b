"""`make site`: the executed course as static HTML in build/site/ (Sphinx + MyST-NB, offline).

    python tools/build_site.py [--executed build/executed] [--out build/site] [--no-execute]

1. The notebooks are not executed again: the copies `make test` left in build/executed/ are used
   when they hold the stored notebook's cells and no error; any other notebook is copied to a
   scratch folder and that copy is executed, in the `tiny` profile
   (`python -m rlhf_helpers.course.run_course --notebooks SCRATCH --out SCRATCH NAME ...`; a
   notebook saved meanwhile changes nothing), unless --no-execute (then a stale copy is used as it
   is, and says so). An executed copy is replaced only where it is a tool's own, as a hidden record
   beside it says (`rlhf_helpers.course.tool_files`; the notebook tests keep one too, and a copy
   in this checkout's build/ older than the records counts as theirs), by a file renamed into
   place, never written through a link: a person's copy to be replaced (edited since, put there by
   hand, a link) stops the build, exit 2, with one line naming it, and is kept.
2. The pages are staged in build/site-src/ under their repository paths, so their relative links
   work as on GitHub: an index from the README's course map, the 8 notebooks, notebooks/NOTATION.md,
   docs/metrics.md, benchmarks/README.md and docs/cluster.md. A link to any other repository file or
   folder goes to it on GitHub (the repository of the Colab set-up cell, branch main); a link to the
   README goes to the index.
3. In the notebooks' site copies, every output that would need a kernel or the internet is replaced:
   each plotly figure by HTML drawn with the site's own plotly.js; each explorer (an ipywidgets box)
   by its static twin (`rlhf_helpers.widgets.static_explorer`: sliders whose every position the
   explorer computed here, and a caption naming them and the controls held fixed); each finished
   tqdm bar by its last text as a muted line, while a bar the code closed (leave=False) and the
   `datasets` library's map/filter bars are dropped; an exercise check's "NOT DONE" line by where to
   write the exercise; plotly's CDN loader outputs are dropped. An image output gets an alt text.
   The cells that check the prose's claims on the run's numbers (tag "claim-check") are left off.
4. sphinx-build writes build/site/ (conf: site/conf.py, which also copies plotly.js and MathJax in).
   The site carries a marker file listing every file it wrote (SITE_MARKER): a later build deletes
   those files only, and refuses an --out that is not empty and not such a site, or that holds
   files it did not write (`replace_site`).

Prints each step's time. Staged files are rewritten only when they change, so a second build is
quick.
"""

from __future__ import annotations

# ruff: noqa: E402 - run as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("tools/build_site.py")

import argparse
import functools
import html
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlhf_helpers.course.notebook import EXERCISE_TODO, colab_url, repo_url  # noqa: E402
from rlhf_helpers.course.run_course import course_notebooks  # noqa: E402
from rlhf_helpers.course.tool_files import replace_problem, write_recorded  # noqa: E402
from rlhf_helpers.runtime.interrupt import one_line_interrupt  # noqa: E402
from rlhf_helpers.widgets.static_explorer import static_explorer, static_explorer_html  # noqa: E402

EXECUTED = Path(os.environ.get("RLHF_EXECUTED_DIR") or ROOT / "build" / "executed")
STAGE = ROOT / "build" / "site-src"
OUT = ROOT / "build" / "site"
DOCTREES = ROOT / "build" / "site-doctrees"
#: the pages besides the index and the notebooks, in the order of the sidebar
REFERENCE_PAGES = ["notebooks/NOTATION.md", "docs/metrics.md", "benchmarks/README.md",
                   "docs/cluster.md"]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
STATE_MIME = "application/vnd.jupyter.widget-state+json"
CLAIM_TAG = "claim-check"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: which explorer a saved widget box is, by a control only it has
EXPLORER_BY_CONTROL = {"advantage": "ClipExplorer", "lam": "GAEExplorer", "shift": "KLExplorer",
                       "value_clip": "ValueClipExplorer"}
_LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")  # markdown [text](target) and ![alt](src)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
#: the course repository on GitHub (the Colab set-up cell's), branch main: where a non-page file is
#: linked
GITHUB = repo_url()
GITHUB_BRANCH = "main"
#: the line exercise_check prints for an exercise whose stub still raises NotImplementedError
_EXERCISE_TODO = re.compile(rf"^{re.escape(EXERCISE_TODO)}\s+(?P<name>[^\n:]*?):[^\n]*\n?", re.M)
EXERCISE_ON_SITE = (
    "write it in the notebook (JupyterLab or Colab), where this check runs; the solution is below.")
_IMAGE_FILE = re.compile(r"([\w.-]+)\.(?:png|jpe?g|gif|svg|webp)\b")


def notebook_pages() -> list[str]:
    """The course notebooks' repository paths, in order."""
    return [f"notebooks/{p.name}" for p in course_notebooks()]


# ---------------------------------------------------------------- executed notebooks


#: a notebook that cannot be read whole (missing, or cut short: an editor saving it) is read again
#: this many times, this far apart, before the build gives up on it
READ_TRIES = 5
READ_PAUSE_S = 0.2


class Refused(SystemExit):
    """Bad input (a notebook that is not whole, an --out that is not this tool's, a missing
    executed copy): exit 2, its one line on stderr; str() is the message."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def refuse(message: str) -> Refused:
    """Print `message` as the tool's one error line; the Refused to raise."""
    print(f"tools/build_site.py: error: {message}", file=sys.stderr, flush=True)
    return Refused(message)



def read_stored(path: Path) -> tuple[bytes, dict]:
    """The bytes of notebook `path` and its JSON, read again while it is missing or not a whole
    notebook (a save in progress: JupyterLab rewrites the file in place); SystemExit with one line
    naming the file if it stays so."""
    problem = ""
    for attempt in range(READ_TRIES):
        if attempt:
            time.sleep(READ_PAUSE_S)
        try:
            data = path.read_bytes()
            notebook = json.loads(data.decode("utf-8"))
        except FileNotFoundError:
            problem = "missing"
            continue
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError: a file being written
            problem = f"not a whole notebook ({type(error).__name__})"
            continue
        if isinstance(notebook, dict) and isinstance(notebook.get("cells"), list):
            return data, notebook
        problem = "not a notebook (no list of cells)"
    raise refuse(f"{path}: {problem} in {READ_TRIES} reads {READ_PAUSE_S:g} s apart; if an "
                 "editor is saving it, run the build again")


def _stale_against(stored: dict, executed: Path) -> str | None:
    """Why `executed` cannot stand for the notebook `stored` (its JSON) on the site, or None."""
    if not executed.is_file():
        return "missing"
    try:  # a copy cut short (a killed run, a full disk) is run again, like a missing one
        ran = json.loads(executed.read_text(encoding="utf-8"))
        ran_sources = [c["source"] for c in ran["cells"]]
    # JSONDecodeError and UnicodeDecodeError are ValueErrors
    except (ValueError, KeyError, TypeError) as error:
        return f"unreadable ({type(error).__name__})"
    if ran_sources != [c["source"] for c in stored["cells"]]:
        return "from an older version of the notebook"
    if any(o.get("output_type") == "error" for c in ran["cells"] for o in c.get("outputs", [])):
        return "its run failed"
    return None


def stale_reason(stored: Path, executed: Path) -> str | None:
    """Why `executed` cannot stand for `stored` on the site (missing, other cells, an error), or
    None."""
    return _stale_against(read_stored(stored)[1], executed)


def _others_copy(path: Path) -> str | None:
    """Why the executed copy `path` is not this tool's to replace (a person's: edited since a tool
    of the course wrote it, never written by one, a link), or None. A copy in this checkout's
    build/ with no record at all was written before the tools kept records: build/ is make's."""
    return replace_problem(path, unrecorded_under=ROOT / "build")


def refuse_others(executed_dir: Path, todo: dict[str, str]) -> None:
    """Exit 2, with one line naming them, when executed copies the build would replace (`todo`:
    stem -> why stale) are not its own (`_others_copy`): nothing of a person's is replaced."""
    others = [f"{problem} ({why})" for stem, why in todo.items()
              if (problem := _others_copy(executed_dir / f"{stem}.ipynb"))]
    if not others:
        return
    print("tools/build_site.py: error: the site needs these executed notebooks run again, but "
          f"they are not this tool's to replace: {'; '.join(others)}. Move them away (they are "
          "kept as they are), or pass --no-execute to build the site from them as they are",
          file=sys.stderr, flush=True)
    raise SystemExit(2)


def ensure_executed(executed_dir: Path, notebooks_dir: Path | None = None) -> None:
    """Execute (tiny profile) every notebook of `notebooks_dir` (notebooks/) whose executed copy is
    missing or stale.

    Each notebook is read once, into a scratch folder, and that copy is what runs and what its
    executed copy is compared with: a notebook saved meanwhile (JupyterLab's autosave) changes
    neither, and is run again next time."""
    # run_course writes a failed run too
    with tempfile.TemporaryDirectory(prefix="rlhf-site-") as scratch:
        copies, ran = Path(scratch) / "notebooks", Path(scratch) / "executed"
        copies.mkdir()
        todo = {}
        for path in course_notebooks() if notebooks_dir is None else course_notebooks(
                notebooks_dir):
            data, stored = read_stored(path)
            why = _stale_against(stored, executed_dir / path.name)
            if why:
                (copies / path.name).write_bytes(data)
                todo[path.stem] = why
        if not todo:
            return
        refuse_others(executed_dir, todo)  # before minutes of running
        print("executing " + ", ".join(f"{stem} ({why})" for stem, why in todo.items()), flush=True)
        # what the runs train goes to the scratch folder, the content-keyed caches to the tests'
        # (build/): nothing is written into the checkout outside build/
        env = {**os.environ, "RLHF_PROFILE": os.environ.get("RLHF_PROFILE", "tiny"),
               "RLHF_RUNS_DIR": str(Path(scratch) / "runs"),
               "RLHF_CACHE_DIR": os.environ.get("RLHF_CACHE_DIR")
               or str(ROOT / "build" / "test-cache")}
        run = subprocess.run([sys.executable, "-m", "rlhf_helpers.course.run_course", "--notebooks",
                              str(copies), "--out", str(ran), *todo], cwd=ROOT, env=env)
        executed_dir.mkdir(parents=True, exist_ok=True)
        # only the runs that passed replace what was there, as the notebook tests do, and only a
        # copy still the tools' own (not edited while it ran)
        passed = [stem for stem in todo if _stale_against(
            json.loads((copies / f"{stem}.ipynb").read_text(encoding="utf-8")),
            ran / f"{stem}.ipynb") is None]
        kept = {stem: todo[stem] for stem in passed
                if _others_copy(executed_dir / f"{stem}.ipynb")}  # put there while it ran
        for stem in passed:
            if stem not in kept:
                write_recorded(executed_dir / f"{stem}.ipynb",
                               (ran / f"{stem}.ipynb").read_bytes())
        refuse_others(executed_dir, kept)
    if run.returncode != 0:
        raise SystemExit(
            "a notebook failed to execute (above); the site needs every notebook executed")


# ---------------------------------------------------------------- links


@functools.cache
def repository_files() -> frozenset[str]:
    """The repository's tracked files (git ls-files); every file under ROOT when git cannot say."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True).stdout
        return frozenset(listed.decode().split("\0")) - {""}
    except (OSError, subprocess.CalledProcessError):
        return frozenset(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file())


def github_url(path: str) -> str | None:
    """The GitHub page of repository file or folder `path` (branch GITHUB_BRANCH), None if it is not
    tracked."""
    files = repository_files()
    if path in files:
        return f"{GITHUB}/blob/{GITHUB_BRANCH}/{path}"
    if any(f.startswith(path.rstrip("/") + "/") for f in files):
        return f"{GITHUB}/tree/{GITHUB_BRANCH}/{path.rstrip('/')}"
    return None


def rewrite_links(text: str, source: str, pages: set[str]) -> tuple[str, set[str]]:
    """Markdown of repository file `source` with its relative links fitted to the site.

    Links to pages stay (the site keeps repository paths); a link to README.md goes to the index; an
    image that exists stays and is returned, to be copied; a link to any other repository file or
    folder goes to it on GitHub (github_url), with its label; one to a path git does not track
    becomes the label or the path, in code. Returns the text and the repository paths of the
    images."""
    images: set[str] = set()

    def fit(match: re.Match) -> str:
        bang, label, target = match.groups()
        if _SCHEME.match(target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        relative = posixpath.relpath(resolved, posixpath.dirname(source) or ".")
        if resolved in pages:
            return match.group(0)
        if resolved == "README.md":
            index = posixpath.relpath("index.md", posixpath.dirname(source) or ".")
            return f"[{label}]({index}{'#the-course-map' if anchor == 'the-course-map' else ''})"
        if bang and (ROOT / resolved).is_file():
            images.add(resolved)
            return f"![{label}]({relative})"
        url = github_url(resolved)
        if url is not None and not bang:
            return f"[{label or f'`{resolved}`'}]({url}{'#' + anchor if anchor else ''})"
        code = f"`{resolved}`"
        return code if label.strip("`") in ("", resolved, path) else f"{label} ({code})"

    return _LINK.sub(fit, text), images


def index_markdown(readme: str) -> str:
    """The site's front page: the README's title and opening paragraph, its course map, the other
    pages."""
    title, _, rest = readme.partition("\n")
    opening = rest.strip().split("\n\n")[0]
    course_map = re.search(r"^## The course map\n.*?(?=^## )", readme, re.M | re.S)
    if course_map is None:
        raise ValueError("README.md has no '## The course map' section")
    names = [p.removesuffix(".ipynb") for p in notebook_pages()]
    reference = [p.removesuffix(".md") for p in REFERENCE_PAGES]
    run_it = (
        "**Run it yourself:** open any notebook in Colab with the \"Open in Colab\" link at its "
        f"top (notebook 01: [Open in Colab \u2197]({colab_url(Path(notebook_pages()[0]).name)})), "
        f"or clone the repository, [{GITHUB.removeprefix('https://')}]({GITHUB}), and run `make "
        "lab` in the checkout (its README's set-up section says what that installs).")
    return "\n\n".join([
        title, opening, run_it, course_map.group(0).strip(),
        "## Reference\n\n- [Notation](notebooks/NOTATION.md): one meaning per symbol\n"
        "- [Metrics glossary](docs/metrics.md): every logged PPO metric, its healthy range, what a "
        "bad value means\n"
        "- [Benchmarks](benchmarks/README.md): speed, memory and learning, against TRL\n"
        "- [From this course to a cluster](docs/cluster.md): the PPO knobs in verl and OpenRLHF",
        "These pages show the notebooks as executed in the `tiny` profile; the explorers' sliders "
        "move through values computed in advance (each names the controls it holds fixed).",
        "```{toctree}\n:hidden:\n:caption: Notebooks\n\n" + "\n".join(names) + "\n```",
        "```{toctree}\n:hidden:\n:caption: Reference\n\n" + "\n".join(reference) + "\n```",
    ]) + "\n"


# ---------------------------------------------------------------- notebook outputs


def figure_html(figure: dict, element_id: str) -> str:
    """A plotly figure (JSON) as a <div> drawn by the page's plotly.js, fitted to the width it is
    drawn at by the site's script (site/static/rlhf-figures.js: titles wrapped, panels stacked and
    the legend moved under the plot on a phone)."""
    layout = {k: v for k, v in figure.get("layout", {}).items() if k != "width"}
    height = layout.get("height", 450)
    spec = json.dumps({"data": figure.get("data", []), "layout": layout},
                      separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    return (f'<div id="{element_id}" class="rlhf-site-figure" '
            f'style="width:100%;height:{height}px"></div>\n<script '
            f'type="text/javascript">(function () {{\n  var fig = {spec};\n'
            f'  function draw() {{ rlhfFigures.draw(document.getElementById("{element_id}"), '
            f'fig.data, fig.layout); }}\n'
            '  if (window.Plotly && window.rlhfFigures) { draw(); } else { '
            'window.addEventListener("load", draw); }\n})();</script>')


def _model(state: dict, ref: str) -> dict:
    return state[ref.removeprefix("IPY_MODEL_")]


def _descendants(state: dict, model: dict) -> list[dict]:
    out = []
    for ref in model["state"].get("children", []):
        child = _model(state, ref)
        out += [child, *_descendants(state, child)]
    return out


def explorer_controls(state: dict, box: dict) -> tuple[dict[str, object],
                                                       dict[str, tuple[float, float]]]:
    """The saved explorer box's control values (by control name) and its sliders' (min, max)."""
    values, ranges = {}, {}
    for model in _descendants(state, box):
        s = model["state"]
        classes = [c.removeprefix("rlhf-") for c in s.get("_dom_classes", [])
                   if c.startswith("rlhf-")]
        if model["model_name"] == "CheckboxModel" and "dual-toggle" in classes:
            values["dual"] = s["value"]
        elif model["model_name"] == "DropdownModel":
            values["kl_kind"] = s["_options_labels"][s["index"]]
        elif classes and classes[0] not in ("explorer", "status"):
            slider, text = (_model(state, ref)["state"] for ref in s["children"])
            values[classes[0]] = text["value"]
            ranges[classes[0]] = (slider["min"], slider["max"])
    return values, ranges


def tqdm_parts(state: dict, box: dict) -> tuple[str, float, str] | None:
    """A saved tqdm bar as (text left of the bar, fraction done, text right of it), else None."""
    parts = [_model(state, ref) for ref in box["state"].get("children", [])]
    if [p["model_name"] for p in parts] != ["HTMLModel", "FloatProgressModel", "HTMLModel"]:
        return None
    bar = parts[1]["state"]
    left, right = (html.unescape(p["state"]["value"]).replace("\u2007", " ")
                   for p in (parts[0], parts[2]))
    return left, (bar["value"] / bar["max"] if bar.get("max") else 0.0), right


def tqdm_text(state: dict, box: dict) -> str | None:
    """A saved tqdm bar (description, progress, counter) as the text line tqdm prints, else None."""
    parts = tqdm_parts(state, box)
    if parts is None:
        return None
    filled = round(10 * parts[1])
    return f"{parts[0]}|{'█' * filled}{' ' * (10 - filled)}|{parts[2]}\n"


def _closed_descriptions(source: str) -> list[re.Pattern]:
    """The descriptions (desc=...) of the tqdm calls with leave=False in a cell's source, as
    patterns (an f-string's {...} matches anything)."""
    found = []
    for call in re.findall(r"tqdm\((?:[^()]|\([^()]*\))*\)", source):
        desc = re.search(r"\bdesc\s*=\s*(f?)(['\"])(.*?)\2", call)
        if re.search(r"\bleave\s*=\s*False\b", call) and desc:
            pieces = re.split(r"\{[^{}]*\}", desc.group(3)) if desc.group(1) else [desc.group(3)]
            found.append(re.compile(".*".join(map(re.escape, pieces)) + r":"))
    return found


def tqdm_dropped(state: dict, box: dict, source: str) -> bool:
    """True for a bar the page leaves out: one the code closed (leave=False: tqdm hides it when
    done, which its saved layout records, or its description matches a leave=False call in the
    cell), or a map/filter bar of the `datasets` library (unit "examples"), which says nothing about
    the course."""
    layout = box["state"].get("layout")
    layout = (_model(state, layout)["state"]
              if isinstance(layout, str) and layout.removeprefix("IPY_MODEL_") in state \
        else {})
    if (layout.get("visibility") == "hidden" or layout.get("display") == "none"
        or box["state"].get("visible") is False):
        return True
    left, _, right = tqdm_parts(state, box)
    if re.search(r"\bexamples(/s)?\]", right):
        return True
    return any(pattern.match(left.strip()) for pattern in _closed_descriptions(source))


def progress_html(line: str) -> str:
    """A finished bar's last text as a plain, muted line (not tqdm's stderr, which the theme shows
    as an error)."""
    return f'<pre class="rlhf-progress">{html.escape(line.rstrip())}</pre>'


def site_stream(out: dict) -> dict | None:
    """A stream output as the site shows it: an exercise's "NOT DONE" line says where the exercise
    is written."""
    if out.get("name") != "stdout":
        return out
    text = "".join(out["text"]) if isinstance(out["text"], list) else out["text"]
    new = _EXERCISE_TODO.sub(lambda m: f"{m.group('name').strip()}: {EXERCISE_ON_SITE}\n", text)
    return out if new == text else {**out, "text": new}


def image_alt(source: str, alts: dict[str, str]) -> str:
    """Alt text of an image a cell displays: the README's alt for the image file the source names,
    else "figure: <file name in words>", else "figure"."""
    for match in _IMAGE_FILE.finditer(source):
        if match.group(0) in alts:
            return alts[match.group(0)]
        return "figure: " + re.sub(r"[_.-]+", " ", match.group(1)).strip()
    return "figure"


def _html_output(text: str) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": text}}


def site_notebook(nb: dict, stem: str, alts: dict[str, str] | None = None) -> dict:
    """The executed notebook `nb` with outputs that need neither a kernel nor the internet (see
    module doc).

    `alts`: alt texts of image files by file name (from the markdown pages), for the images cells
    display."""
    state = nb.get("metadata", {}).pop("widgets", {}).get(STATE_MIME, {}).get("state", {})
    # a claim-check cell asserts the prose above it on the run's numbers: nothing for a reader of
    # the site
    nb["cells"] = [cell for cell in nb["cells"]
                   if CLAIM_TAG not in cell.get("metadata", {}).get("tags", [])]
    for i, cell in enumerate(nb["cells"]):
        outputs, new = cell.get("outputs", []), []
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        boxes = [_model(state, o["data"][WIDGET_MIME]["model_id"]) for o in outputs
                 if WIDGET_MIME in o.get("data", {})
                 and o["data"][WIDGET_MIME]["model_id"] in state]
        explorer = next(
            (b for b in boxes if "rlhf-explorer" in b["state"].get("_dom_classes", [])), None)
        for k, out in enumerate(outputs):
            data = out.get("data", {})
            element_id = f"{stem}-{i}-{k}"
            if WIDGET_MIME in data:
                model = state.get(data[WIDGET_MIME]["model_id"])
                if model is not None and model is explorer:
                    new.append(_html_output(_explorer_html(state, model, outputs, element_id)))
                elif model is not None and (line := tqdm_text(state, model)) is not None:
                    if not tqdm_dropped(state, model, source):
                        new.append(_html_output(progress_html(line)))
                continue  # a widget that was not saved has nothing to show
            if PLOTLY_MIME in data:
                if explorer is None:  # an explorer's own figure: its static twin replaces it
                    new.append(_html_output(figure_html(data[PLOTLY_MIME], element_id)))
                continue
            if set(data) == {"text/html"} and "cdn.plot.ly" in "".join(data["text/html"]):
                # plotly's loader for notebook_connected figures: the site has its own plotly.js
                continue
            # MyST-NB's alt is the image's file path
            if any(mime.startswith("image/") for mime in data):
                options = cell.setdefault("metadata", {}).setdefault("mystnb",
                                                                     {}).setdefault("image", {})
                options.setdefault("alt", image_alt(source, alts or {}))
            new.append(site_stream(out) if out.get("output_type") == "stream" else out)
        if cell["cell_type"] == "code":
            cell["outputs"] = new
    return nb


def _explorer_html(state: dict, box: dict, outputs: list[dict], element_id: str) -> str:
    controls, ranges = explorer_controls(state, box)
    kind = next((k for c, k in EXPLORER_BY_CONTROL.items() if c in controls), None)
    if kind is None:
        raise SystemExit(f"an explorer with controls {sorted(controls)} is not one the site knows: "
                         "build/executed/ holds a notebook run by older code; delete it, rerun")
    options: dict[str, object] = {}
    if kind == "ClipExplorer":
        options["ratio_range"] = ranges["ratio"]
        figures = [o["data"][PLOTLY_MIME] for o in outputs if PLOTLY_MIME in o.get("data", {})]
        batch = [t for f in figures for t in f["data"]
                 if t.get("type") == "histogram" and t.get("x")]
        if batch and batch[0].get("visible", True):
            options["ratios"] = batch[0]["x"]
    elif kind == "ValueClipExplorer":
        options["value_range"] = ranges["value"]
    return static_explorer_html(static_explorer(kind, controls, **options), element_id)


# ---------------------------------------------------------------- staging and building


def _write(path: Path, text: str) -> None:
    """Write only if the content changes (Sphinx then rebuilds only what changed)."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def stage(executed_dir: Path, stage_dir: Path) -> None:
    """Write every page's source under `stage_dir`, at its repository path."""
    pages = {*notebook_pages(), *REFERENCE_PAGES}
    images: set[str] = set()
    alts = {posixpath.basename(src): alt for page in ("README.md", *REFERENCE_PAGES) for bang, alt,
            src in _LINK.findall((ROOT / page).read_text(encoding="utf-8")) if bang and alt}
    text, found = rewrite_links(index_markdown((ROOT / "README.md").read_text(encoding="utf-8")),
                                "README.md", pages)
    _write(stage_dir / "index.md", text)
    images |= found
    for page in REFERENCE_PAGES:
        text, found = rewrite_links((ROOT / page).read_text(encoding="utf-8"), page, pages)
        _write(stage_dir / page, text)
        images |= found
    for page in notebook_pages():
        nb = site_notebook(json.loads((executed_dir / Path(page).name).read_text()),
                           Path(page).stem, alts)
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                source, found = rewrite_links("".join(cell["source"]), page, pages)
                cell["source"], images = source, images | found
        _write(stage_dir / page, json.dumps(nb, ensure_ascii=False, indent=1) + "\n")
    for image in images:
        target = stage_dir / image
        if not target.is_file() or target.read_bytes() != (ROOT / image).read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((ROOT / image).read_bytes())


#: The file a site built here carries at its top: it marks the folder as this tool's and lists the
#: files the build wrote, so that the next build deletes those files and nothing else.
SITE_MARKER = ".rlhf-course-site.json"
#: What the marker says it is (a marker without it, or not JSON, marks nothing).
MARKER_WRITER = "tools/build_site.py"


def site_entries(folder: Path) -> list[str]:
    """Everything under `folder` but its folders, as sorted relative POSIX paths; a link is an entry
    of its own (never followed), a link to a folder too."""
    found = []
    for parent, folders, files in os.walk(folder):  # os.walk follows no link
        base = Path(parent)
        found += [(base / name).relative_to(folder).as_posix()
                  for name in [*files, *(f for f in folders if (base / f).is_symlink())]]
    return sorted(found)


def files_written(out: Path) -> set[str] | None:
    """The files a build of this tool wrote into `out`, as its marker lists them; None when `out`
    holds no marker of this tool (none, a link, not JSON, another writer's)."""
    marker = out / SITE_MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = record.get("files") if isinstance(record, dict) else None
    if (record.get("written_by") != MARKER_WRITER or not isinstance(files, list)
            or not all(isinstance(name, str) for name in files)):
        return None
    return set(files)


def _write_marker(out: Path, files: list[str]) -> None:
    """Write the marker listing `files`: through a temporary file renamed over it (whole or
    absent)."""
    tmp = out / f"{SITE_MARKER}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"written_by": MARKER_WRITER, "files": files}, indent=1) + "\n",
                   encoding="utf-8")
    os.replace(tmp, out / SITE_MARKER)


def _legacy_default_site(out: Path) -> bool:
    """Whether `out` is this checkout's own build/site as built before the marker existed (Sphinx's
    .buildinfo, no marker): build/ is where make writes, so that one folder is replaced whole."""
    return (out.resolve() == OUT.resolve() and (out / ".buildinfo").is_file()
            and not (out / SITE_MARKER).exists())


def _cannot_make(out: Path) -> str | None:
    """Why the folder `out`, not there yet, cannot be made (its nearest existing ancestor is a file,
    or a folder this user may not write in), or None."""
    ancestor = out.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return (f"--out {out} cannot be made: {ancestor} is a file, not a folder; choose another "
                "path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return (f"--out {out} cannot be made: this user may not write in {ancestor}; choose "
                "another path")
    return None


def out_problem(out: Path) -> str | None:
    """Why the site may not be put at `out` (nothing is deleted then), or None. A folder that is
    not empty must be a site this tool built (its marker, SITE_MARKER) holding only files that
    build wrote; a file, a link, a path under a file or a folder this user may not write in, a
    folder of something else (another tool's site with Sphinx's .buildinfo included) or a site of
    this tool with a person's files added is refused. Checked
    before the build, and again before the old site is deleted."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        return (f"--out {out} is {'a link' if out.is_symlink() else 'a file'}, not a folder; "
                "choose a new or empty folder")
    if not out.exists() and (problem := _cannot_make(out)) is not None:
        return problem
    present = site_entries(out) if out.is_dir() else []
    if not present or _legacy_default_site(out):
        return None
    ours = files_written(out)
    if ours is None:
        return (f"--out {out} exists and is not a site this tool built (it has no {SITE_MARKER} "
                f"of {MARKER_WRITER}); choose a new or empty folder")
    others = [name for name in present if name not in ours and name != SITE_MARKER]
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        return (f"--out {out} holds {', '.join(others[:3])}{more}, which this tool did not write: "
                "move them away or choose a new or empty folder (nothing was deleted)")
    return None


def replace_site(built: Path, out: Path) -> None:
    """Put the built site at `out`: the files an earlier build wrote there (its marker lists them)
    are deleted, then the new site is copied in and its files recorded in the marker. SystemExit,
    with nothing deleted, where `out_problem` names a problem."""
    if (problem := out_problem(out)) is not None:
        raise refuse(problem)
    present = site_entries(out) if out.is_dir() else []
    new = site_entries(built)
    out.mkdir(parents=True, exist_ok=True)
    old = [name for name in present if name != SITE_MARKER]
    # a build stopped from here on leaves a folder whose marker lists every file in it
    _write_marker(out, sorted({*old, *new}))
    for name in old:
        (out / name).unlink()
    for folder in sorted({parent for name in old for parent in PurePosixPath(name).parents
                          if parent.parts}, key=lambda p: -len(p.parts)):
        if not any((out / folder).iterdir()):  # only the folders the old site's files emptied
            (out / folder).rmdir()
    shutil.copytree(built, out, dirs_exist_ok=True)
    _write_marker(out, new)


@one_line_interrupt("tools/build_site.py", "the site may be incomplete: build it again")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executed", type=Path, default=EXECUTED,
                        help="executed notebooks (make test's)")
    parser.add_argument("--out", type=Path, default=OUT, help="the site")
    parser.add_argument("--no-execute", action="store_true",
                        help="use the executed copies as they are, even from an older version of a "
                             "notebook")
    args = parser.parse_args(argv)
    if (problem := out_problem(args.out)) is not None:  # before minutes of building
        raise refuse(problem)
    start = time.perf_counter()
    if args.no_execute:
        for notebook in course_notebooks():
            why = stale_reason(notebook, args.executed / notebook.name)
            if why is not None and (why == "missing" or why.startswith("unreadable")):
                raise refuse(f"--no-execute: {args.executed / notebook.name} is {why}")
            if why is not None:
                print(f"--no-execute: {notebook.name}'s executed copy is {why}; used as it "
                      "is", flush=True)
    else:
        ensure_executed(args.executed)
    executed = time.perf_counter()
    stage(args.executed, STAGE)
    staged = time.perf_counter()
    # MyST-NB writes a jupyter_execute/ folder beside Sphinx's output folder: build in a scratch
    # folder, so that nothing lands beside --out, then put the site in place
    with tempfile.TemporaryDirectory(prefix="rlhf-sphinx-") as scratch:
        built = Path(scratch) / "site"
        subprocess.run(
            [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-c",
             str(ROOT / "site"), "-d", str(DOCTREES), str(STAGE), str(built)], check=True, cwd=ROOT)
        replace_site(built, args.out)
    done = time.perf_counter()
    print(f"site: {args.out}/index.html (executing {executed - start:.1f} s, staging "
          f"{staged - executed:.1f} s, sphinx {done - staged:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
