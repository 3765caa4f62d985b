"""Every notebook's figures as a learner sees them: JupyterLab's default layout in a 1400 x 1000
window.

The notebooks are not run again: `test_notebook_runs_as_shipped` leaves each executed notebook under
build/executed/ (tests/notebooks/test_notebooks.py, EXECUTED_DIR), and `make test` runs this file
after it. Each executed notebook is opened in JupyterLab as installed (plotly's renderer extension
on, the file browser open on the left, as after `make lab`), where its stored plotly outputs draw
without a kernel. For every notebook:

- every stored plotly figure draws (the explorers' first figure included: in a headless run their
  backend is "html", whose first figure is plotly JSON);
- each figure is no wider than its output area (a fixed width larger than the area is cut off, and
  the output area's scrollbar is easy to miss) and has a title;
- no output holds a tqdm bar of a loop that took under a second (elapsed "00:00": noise, not
  progress), read from the widget state the notebook stores (a bar is a widget: its last text is
  kept there) and from the stream outputs (a bar written to stderr).

A screenshot of every figure goes to build/figures/<notebook>/ for a developer to look at.
Skipped with a reason when chromium, playwright or the executed notebooks are missing, except on CI
(CI=true), where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from figure_overlaps import OVERLAPS
from test_notebooks import EXECUTED_DIR, NOTEBOOKS
from test_widgets_browser import (  # noqa: F401 (fixtures)
    _jupyterlab,
    _refuse_internet,
    browser,
    browser_ready,
)

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "figures"
#: the window of the issue's report: JupyterLab's default layout leaves an output area of ~968 px
VIEWPORT = {"width": 1400, "height": 1000}
#: longest wait for the notebook's figures (JupyterLab's first page load on a busy machine)
WAIT_MS = 90_000
PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: a tqdm bar's counter and elapsed time, "8/8 [00:00<00:00, 41.2it/s]": under a second when elapsed
#: is 00:00
SUB_SECOND_BAR = re.compile(r"\d+/\d+\s*\[00:00<")

pytestmark = [pytest.mark.browser, pytest.mark.figures, pytest.mark.timeout(300)]


def _executed(path: Path) -> Path:
    """The executed copy of stored notebook `path`; it must hold the same cells (else it is
    stale)."""
    executed = EXECUTED_DIR / path.name
    reason = None
    if not executed.is_file():
        reason = f"{executed} is missing: run the notebook tests first (make test)"
    else:
        stored = [c["source"] for c in json.loads(path.read_text())["cells"]]
        ran = [c["source"] for c in json.loads(executed.read_text())["cells"]]
        if ran != stored:
            reason = (
                f"{executed} is from an older version of {path.name}: run the notebook tests again")
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return executed


def _plotly_outputs(nb: dict) -> int:
    return sum(PLOTLY_MIME in out.get("data", {}) for cell in nb["cells"]
               for out in cell.get("outputs", []))


def sub_second_bars(nb: dict) -> list[str]:
    """The text of every tqdm bar in `nb` whose loop took under a second (widget state and text
    outputs)."""
    found = []
    state = nb.get("metadata", {}).get("widgets",
                                       {}).get("application/vnd.jupyter.widget-state+json", {})
    for model in state.get("state", {}).values():
        value = model.get("state", {}).get("value")
        if (model.get("model_name") == "HTMLModel" and isinstance(value, str)
            and SUB_SECOND_BAR.search(value)):
            found.append(value.replace("\u2007", " "))
    # a widget output's text/plain is the bar at its start ("0/8 [00:00<?"): not read
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if out.get("output_type") != "stream":
                continue
            text = "".join(out["text"]) if isinstance(out["text"], list) else out["text"]
            found += [line.strip() for line in re.split(r"[\r\n]", text)
                      if SUB_SECOND_BAR.search(line)]
    return found


def test_sub_second_bars_are_found():
    """The detector itself, on a bar state as tqdm.auto stores it and on a stderr bar."""
    nb = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"state": {
        "a": {"model_name": "HTMLModel",
              "state": {"value": "\u20078/8\u2007[00:00<00:00,\u200741.2it/s]"}},
        "b": {"model_name": "HTMLModel",
              "state": {"value": "\u200730/30\u2007[00:31<00:00,\u20071.0s/it]"}}}}}},
        "cells": [{"outputs": [
            {"output_type": "stream", "text": "runs: 100%|##| 2/2 [00:00<00:00]\r\n"}]}]}
    assert sub_second_bars(nb) == [" 8/8 [00:00<00:00, 41.2it/s]",
                                   "runs: 100%|##| 2/2 [00:00<00:00]"]


@pytest.fixture(scope="module")
def course_lab(browser_ready, tmp_path_factory) -> Iterator[dict]:  # noqa: F811 (the imported fixture)
    """JupyterLab as installed, drawing every cell (no windowing: it takes cells off the page once
    scrolled past)."""
    settings = {"@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"}}
    with _jupyterlab(tmp_path_factory.mktemp("course_lab"), plotly_extension=True, kernel_env={},
                     settings=settings) as server:
        yield server


#: every drawn plotly figure: the width it draws (its widest svg layer) against the width its output
#: shows (the output node's client width: the figure's own node for plotly's renderer, so a wider
#: figure scrolls)
FIGURES = ("""() => Array.from(document.querySelectorAll('.jp-NotebookPanel .js-plotly-plot'))
    .filter(gd => gd.querySelector('.main-svg'))
    .map(gd => {
        const area = gd.closest('.jp-OutputArea-output') ?? gd.parentElement;
"""
    "        const svgs = Array.from(gd.querySelectorAll('.main-svg'))"
    ".map(svg => svg.getBoundingClientRect().width);\n"
    "        return {width: Math.max(...svgs), area: area.clientWidth,\n"
    "                title: (gd.querySelector('.gtitle')?.textContent ?? '').trim(),"
    " overlaps: (OVERLAPS)(gd)};\n"
    """    })""").replace("OVERLAPS", OVERLAPS)


def _scroll_through(page) -> None:
    """Scroll the notebook from top to bottom a screen at a time, as a reader does."""
    while True:  # the notebook's scrolling element: the panel's largest one that scrolls
        at_end = page.evaluate("""() => {
            const el = Array.from(document.querySelectorAll('.jp-NotebookPanel *'))
"""
            "                .filter(e => e.scrollHeight > e.clientHeight + 2"
            " && getComputedStyle(e).overflowY !== 'visible')\n"
            """                .sort((a, b) => b.scrollHeight - a.scrollHeight)[0];
            if (!el) return true;
            el.scrollTop += el.clientHeight * 0.8;
            return el.scrollTop + el.clientHeight >= el.scrollHeight - 2;
        }""")
        page.wait_for_timeout(300)
        if at_end:
            break


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_figures_fit_the_output_area_with_a_title(course_lab, browser, path: Path) -> None:  # noqa: F811 (fixture)
    executed = _executed(path)
    nb = json.loads(executed.read_text())
    assert not sub_second_bars(nb), \
        f"{path.name}: tqdm bars of sub-second loops: {sub_second_bars(nb)}"
    expected = _plotly_outputs(nb)
    # every deep dive unfolded, as a learner who opens them sees its figures
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("jp-MarkdownHeadingCollapsed", None)
    (course_lab["root"] / path.name).write_text(json.dumps(nb))
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    _refuse_internet(page)
    out_dir = SHOTS / path.stem
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    try:
        page.goto(f"{course_lab['url']}/lab/tree/{path.name}?token={course_lab['token']}&reset")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=WAIT_MS)
        try:
            # plotly draws a figure once it is on screen, as a learner scrolls to it
            _scroll_through(page)
            page.wait_for_function(f"() => ({FIGURES})().length >= {expected}", timeout=WAIT_MS)
        except Exception:  # say what is there instead of only "timeout"
            page.screenshot(path=str(out_dir / "failure.png"))
            raise AssertionError(f"{path.name}: {len(page.evaluate(FIGURES))} of {expected} plotly "
                                 f"figures drew; screenshot {out_dir / 'failure.png'}") from None
        page.wait_for_timeout(500)  # plotly's autosize settles on the next frame
        assert page.locator("#jp-left-stack").bounding_box()["width"] > 100, \
            "the file browser should be open"
        figures = page.evaluate(FIGURES)
        assert len(figures) == expected
        # +1 px: the output area and plotly round their widths separately to whole pixels
        too_wide = [f for f in figures if f["width"] > f["area"] + 1]
        assert not too_wide, f"{path.name}: figures wider than their output area: {too_wide}"
        colliding = {i: f["overlaps"] for i, f in enumerate(figures) if f["overlaps"]}
        assert not colliding, (
            f"{path.name}: labels running into each other, by figure (in order): {colliding}")
        untitled = [i for i, f in enumerate(figures) if not f["title"]]
        assert not untitled, f"{path.name}: figures {untitled} (in order) have no title"
        plots = page.locator(".jp-NotebookPanel .js-plotly-plot:has(.main-svg)")
        for i in range(plots.count()):
            plots.nth(i).screenshot(path=str(out_dir / f"figure-{i + 1:02d}.png"))
        assert not errors, f"JavaScript errors on the page: {errors}"
    finally:
        page.close()
