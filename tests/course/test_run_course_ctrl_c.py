"""Ctrl-C in `python -m rlhf_helpers.course.run_course` while a notebook's kernel runs a cell: the
run stops there, with one line and exit 130, and runs no further notebook. The kernel is killed,
with whatever it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhf_helpers.runtime.interrupt import interrupted_line

REPO = Path(__file__).resolve().parents[2]
#: the cell of each notebook: says it runs (the kernel's pid), then sleeps far longer than the test
CELL = ("import os, pathlib, time\n"
        "pathlib.Path({marker!r}).write_text(str(os.getpid()))\n"
        "time.sleep(30)\n")


def _notebook(path: Path, marker: Path) -> None:
    cell = {"cell_type": "code", "execution_count": None, "id": "a1", "metadata": {},
            "outputs": [], "source": CELL.format(marker=str(marker))}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))


def _wait_for(condition, seconds: float) -> bool:
    """Whether `condition()` came true within `seconds` (a bound against a hang, not a timing)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_ctrl_c_while_a_kernel_runs_is_one_line_exit_130_and_no_next_notebook(tmp_path):
    """Before: the kernel printed a zmq traceback, nbclient a "Task exception was never
    retrieved" one; the notebook was reported FAILED (AssertionError), the next one ran, and
    the run exited 1."""
    notebooks, out = tmp_path / "notebooks", tmp_path / "out"
    notebooks.mkdir()
    first, second = tmp_path / "first-runs", tmp_path / "second-runs"
    _notebook(notebooks / "01_first.ipynb", first)
    _notebook(notebooks / "02_second.ipynb", second)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    # its own session: SIGINT to its process group, as a terminal sends Ctrl-C
    process = subprocess.Popen(
        [sys.executable, "-m", "rlhf_helpers.course.run_course", "--out", str(out),
         "--notebooks", str(notebooks)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert _wait_for(lambda: first.exists() and first.read_text(), 120), "the cell never ran"
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    # the kernel's own start-up warning (ipykernel on TCP) is not the run's
    lines = [line for line in stderr.splitlines() if not line.startswith("[IPKernelApp] WARNING")]
    assert process.returncode == 130, stderr
    assert lines == [interrupted_line("python -m rlhf_helpers.course.run_course",
                                      "the notebooks that finished before it are in --out")]
    assert not second.exists() and "02_second" not in stdout and "FAILED" not in stdout
    assert not (out / "01_first.ipynb").exists()  # no copy of a run cut short
    assert _wait_for(lambda: _gone(int(first.read_text())), 30), "the kernel still runs"
