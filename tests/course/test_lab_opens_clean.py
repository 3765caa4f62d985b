"""Opening a course notebook in JupyterLab changes nothing: no modified mark (●), no "save
changes?".

JupyterLab writes the connecting kernel's `kernelspec` and `language_info` (with the exact Python
version) into a notebook's metadata, which marks a stored notebook modified the moment its kernel
starts. `make lab` starts JupyterLab with the course's contents manager
(rlhf_helpers/course/lab_contents.py), which hands each notebook over with that metadata already in
place. Here every shipped notebook is opened as `make lab` opens it (the server options are read
from the Makefile), its kernel is waited for, and the tab must not be dirty. The same check on a
stock server must see the mark, so the check can fail.

Skipped with a reason when chromium or playwright is missing, except when CI=true: then it fails.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_notebooks import NOTEBOOKS
from test_widgets_browser import (  # noqa: F401 (fixtures)
    WAIT_MS,
    _jupyterlab,
    _refuse_internet,
    browser,
    browser_ready,
)

from rlhf_helpers.course.lab_contents import KERNEL_NAME, kernel_metadata

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

#: the open notebook's tab carries this class while its document differs from the file
DIRTY = (
    "() => document.querySelector('#jp-main-dock-panel .lm-TabBar-tab.jp-mod-current')?.classList" \
        ".contains('jp-mod-dirty')")
#: the notebook's kernel has started and connected: the status bar reads "<kernel name> | Idle"
KERNEL_IDLE = (
    "() => /\\| Idle/.test(document.querySelector('.jp-StatusBar-Widget')?.innerText ?? '')")
#: after "Idle", JupyterLab writes the kernel's metadata within a round trip; wait well past it
SETTLE_MS = 1500


def make_lab_server_args() -> tuple[str, ...]:
    """The server options `make lab` passes (its LAB_CONTENTS line)."""
    match = re.search(r"^LAB_CONTENTS := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile has no LAB_CONTENTS line"
    return tuple(match.group(1).split())


@pytest.fixture(scope="module")
def course_lab(browser_ready, tmp_path_factory) -> Iterator[dict]:  # noqa: F811 (the imported fixture)
    with _jupyterlab(tmp_path_factory.mktemp("clean_lab"), plotly_extension=True, kernel_env={},
                     server_args=make_lab_server_args()) as server:
        yield server


@pytest.fixture(scope="module")
def stock_lab(browser_ready, tmp_path_factory) -> Iterator[dict]:  # noqa: F811 (the imported fixture)
    with _jupyterlab(tmp_path_factory.mktemp("stock_lab"), plotly_extension=True,
                     kernel_env={}) as server:
        yield server


def _opens_dirty(lab: dict, browser, path: Path) -> bool:  # noqa: F811 (the imported fixture)
    """Open a copy of the stored notebook, wait for its kernel and for JupyterLab's metadata write;
    whether the tab is then marked modified."""
    shutil.copy(path, lab["root"] / path.name)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    _refuse_internet(page)
    try:
        page.goto(f"{lab['url']}/lab/tree/{path.name}?token={lab['token']}&reset")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=WAIT_MS)
        page.wait_for_function(KERNEL_IDLE, timeout=WAIT_MS)
        page.wait_for_timeout(SETTLE_MS)
        return page.evaluate(DIRTY)
    finally:
        page.close()


def test_the_makefile_starts_jupyterlab_with_the_course_contents_manager() -> None:
    assert ("--ServerApp.contents_manager_class="
            "rlhf_helpers.course.lab_contents.CourseContentsManager") in make_lab_server_args()
    assert re.search(r"^\t.*jupyter lab notebooks/ \$\(LAB_CONTENTS\)",
                     (ROOT / "Makefile").read_text(), re.MULTILINE)


def test_kernel_metadata_is_what_the_kernel_reports() -> None:
    """The metadata handed over equals a real kernel's kernel_info reply (JupyterLab compares them
    exactly)."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name=KERNEL_NAME)
    try:
        reply = client.kernel_info(reply=True, timeout=60)["content"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    expected = kernel_metadata(manager.kernel_spec.display_name)
    assert reply["language_info"] == expected["language_info"]
    assert expected["kernelspec"] == {"name": KERNEL_NAME,
                                      "display_name": manager.kernel_spec.display_name,
                                      "language": manager.kernel_spec.language}


def test_the_check_sees_a_notebook_a_stock_server_marks_modified(stock_lab, browser) -> None:  # noqa: F811
    """Without the contents manager the stored metadata (no Python version) is rewritten on
    connect."""
    assert _opens_dirty(stock_lab, browser, NOTEBOOKS[0])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_opens_unmodified(course_lab, browser, path: Path) -> None:  # noqa: F811 (fixture)
    assert not _opens_dirty(course_lab, browser, path), f"{path.name} opens marked as modified"
