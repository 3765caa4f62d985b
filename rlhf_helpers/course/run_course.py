"""`make course`: execute every notebook in notebooks/ headless and time it.

    python -m rlhf_helpers.course.run_course --out build/ [--timeout S] [--notebooks DIR] [NAME...]

Each notebook runs in a fresh kernel (the `tiny` profile unless RLHF_PROFILE says otherwise, the
hub offline) with a scratch copy of itself as the working directory, so nothing is written into
the repository; the executed copy, outputs included, goes to `--out`. The kernel's explorers use
the "html" display backend unless RLHF_WIDGETS_BACKEND says otherwise: a FigureWidget would store
plotly.js (~4.6 MB) in the saved widget state once per figure (03: 22 MB, 04: 31 MB), whereas an
"html" figure is a few tens of kB of JSON that plotly's JupyterLab extension draws offline. Prints
each notebook's time and the total; exits 1 if any notebook fails.
"""

from __future__ import annotations

# ruff: noqa: E402 - as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("python -m rlhf_helpers.course.run_course")

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rlhf_helpers.course.tool_files import replace_problem, write_recorded
from rlhf_helpers.runtime.artifacts import CACHE_DIR_ENV, RUNS_DIR_ENV
from rlhf_helpers.runtime.data import DATA_DIR_ENV
from rlhf_helpers.runtime.interrupt import one_line_interrupt

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"

#: Environment every headless run gets (unless already set): offline, the CPU profile.
HEADLESS_ENV = {"RLHF_PROFILE": "tiny", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "MPLBACKEND": "Agg"}

#: Set in the kernel only (unless already set): headless explorers save small, offline-viewable
#: figures, and so does `fig.show()`: plotly's JSON (JupyterLab draws it offline) plus HTML that
#: loads plotly.js from the CDN. plotly 5's default ("plotly_mimetype+notebook", Colab's plotly 5.24
#: outside Colab) would paste all of plotly.js (4.7 MB) into the first figure's output.
KERNEL_ENV = {"RLHF_WIDGETS_BACKEND": "html",
              "PLOTLY_RENDERER": "plotly_mimetype+notebook_connected"}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in kernel tracebacks


def kernel_env() -> dict[str, str]:
    """The environment a notebook's kernel gets: KERNEL_ENV under the caller's variables, with the
    folders that $RLHF_RUNS_DIR, $RLHF_CACHE_DIR and $RLHF_DATA_DIR name made absolute against the
    caller's working directory (the kernel runs in another folder, where a relative path would name
    another place)."""
    env = {**KERNEL_ENV, **os.environ}  # the caller's variables win
    for name in (RUNS_DIR_ENV, CACHE_DIR_ENV, DATA_DIR_ENV):
        if env.get(name):
            env[name] = str(Path(env[name]).expanduser().absolute())
    return env


def course_notebooks(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The course notebooks NN_topic.ipynb, in order."""
    return sorted(directory.glob("[0-9][0-9]_*.ipynb"))


def execute_notebook(path: Path, out: Path | None = None, timeout: int = 600,
                     workdir: Path | None = None):
    """Run `path` top to bottom in a fresh kernel; return the executed notebook.

    The kernel's working directory is `workdir` (a new temporary directory if None) holding a copy
    of the notebook. Raises nbclient's CellExecutionError on the first failing cell, and
    KeyboardInterrupt on Ctrl-C (the kernel killed: `stoppable_client`).
    """
    # nbclient/nbformat: only to execute notebooks
    import nbformat

    # nbclient (seconds to import), under it: only to execute notebooks
    from rlhf_helpers.course.stoppable_client import StoppableClient

    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    for key, value in HEADLESS_ENV.items():
        os.environ.setdefault(key, value)
    with tempfile.TemporaryDirectory(prefix="rlhf-nb-") as scratch:
        cwd = Path(workdir) if workdir is not None else Path(scratch)
        if (cwd / path.name).resolve() != Path(path).resolve():
            shutil.copy(path, cwd / path.name)
        nb = nbformat.read(cwd / path.name, as_version=4)
        client = StoppableClient(nb, timeout=timeout, kernel_name="python3",
                                 resources={"metadata": {"path": str(cwd)}})
        try:
            client.execute(env=kernel_env())
        except Exception:
            if client.interrupted:  # the kernel was killed on Ctrl-C: whatever failed after it
                raise KeyboardInterrupt from None
            raise
        finally:
            # never through a link, and recorded as the tool's own copy; a run Ctrl-C cut short
            # leaves the copy of an earlier run as it was, and so does a person's save made
            # while it ran (checked again now: a notebook runs for minutes)
            kept = out is not None and replace_problem(out, ROOT / "build")
            if out is not None and not client.interrupted and not kept:
                write_recorded(out, nbformat.writes(nb).encode("utf-8"))
        if client.interrupted:  # Ctrl-C as the last cell ended
            raise KeyboardInterrupt
        if kept:
            raise CopyKept(f"{kept}, while the course ran: that copy is kept, this run is not "
                           "written")
    return nb


class CopyKept(RuntimeError):
    """The executed copy at --out became a person's while its notebook ran (saved, replaced by a
    link): it is kept, and the run's result is not written."""


@one_line_interrupt("python -m rlhf_helpers.course.run_course",
                    "the notebooks that finished before it are in --out")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute every course notebook headless.")
    parser.add_argument("--out", type=Path, default=ROOT / "build",
                        help="folder for executed copies")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOK_DIR,
                        help="folder of the NN_topic.ipynb notebooks to run (default: the course's "
                             "notebooks/)")
    parser.add_argument("only", nargs="*",
                        help="run only notebooks whose name contains one of these")
    args = parser.parse_args(argv)
    if not args.notebooks.is_dir():
        parser.error(f"--notebooks {args.notebooks}: not a folder")
    notebooks = [p for p in course_notebooks(args.notebooks)
                 if not args.only or any(s in p.name for s in args.only)]
    if not notebooks:
        print("no notebooks matched", file=sys.stderr)
        return 1
    # a person's copy in --out (edited since a tool wrote it, never written by one, a link) is kept
    kept = [problem for path in notebooks
            if (problem := replace_problem(args.out / path.name, ROOT / "build")) is not None]
    if kept:
        print(f"run_course: refused, nothing was run: {'; '.join(kept)}; choose another --out, "
              "or move those files away", file=sys.stderr)
        return 2
    failed, total = [], 0.0
    for path in notebooks:
        start = time.perf_counter()
        try:
            execute_notebook(path, out=args.out / path.name, timeout=args.timeout)
            status = "ok"
        except Exception as error:  # report every notebook, then fail
            last_line = _ANSI.sub("", str(error)).strip().splitlines()[-1:] or [""]
            status = f"FAILED: {type(error).__name__}: {last_line[0]}"
            failed.append(path.name)
        seconds = time.perf_counter() - start
        total += seconds
        print(f"{path.name:<40} {seconds:7.1f} s  {status}", flush=True)
    print(f"{'total':<40} {total:7.1f} s  ({len(notebooks) - len(failed)}/{len(notebooks)} ok)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
