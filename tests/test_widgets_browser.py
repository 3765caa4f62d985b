"""The clip explorer in a real browser: JupyterLab 4 on localhost, driven in headless Chromium.

A JupyterLab server starts on a random free port with token auth and its own temporary config,
data, runtime, settings and workspace folders (nothing of the user's is read or written). Playwright
(pip package; Debian's /usr/bin/chromium, no browser download) opens tests/browser_assets/explorer.ipynb,
runs it, checks the plotly figure rendered, moves the advantage slider with the keyboard, and
checks the plot changed. For each backend ("figurewidget", "output") it saves a screenshot to a
temporary folder; with RLHF_WRITE_SCREENSHOTS=1 the figurewidget run also writes
docs/img/clip_explorer.png (and the GAE explorer docs/img/gae_explorer.png) for the README.

Skipped with a reason when chromium or playwright is missing, except when CI=true: then it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASSET = ROOT / "tests" / "browser_assets" / "explorer.ipynb"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WRITE_SCREENSHOTS = os.environ.get("RLHF_WRITE_SCREENSHOTS") == "1"
WAIT_MS = 90_000  #: longest wait for one selector (a cold kernel start on a busy 2-core machine)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def _missing_requirement() -> str | None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        return "chromium is not installed (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright pip package is not installed"
    return None


@pytest.fixture(scope="module")
def browser_ready() -> None:
    reason = _missing_requirement()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser test cannot run on CI: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def lab(browser_ready, tmp_path_factory) -> Iterator[dict]:
    """A JupyterLab server on 127.0.0.1 with its own temporary Jupyter folders; yields url, token, root."""
    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    root.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                     ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                     ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")]:
        (base / sub).mkdir()
        env[var] = str(base / sub)
    # no "get notified about Jupyter news?" toast over the widget (and no request for news)
    notification = base / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    env.pop("RLHF_WIDGETS_BACKEND", None)  # the notebook names its backend
    port, token = _free_port(), os.urandom(16).hex()
    log = open(base / "server.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly",  # no PyPI look-ups (CI has no internet)
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited early:\n{(base / 'server.log').read_text()[-3000:]}")
            try:
                _get_json(f"{url}/api/status?token={token}")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(base / 'server.log').read_text()[-3000:]}")
                time.sleep(0.3)
        yield {"url": url, "token": token, "root": root, "log": base / "server.log"}
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser(browser_ready) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=shutil.which("chromium") or CHROMIUM,
                                     headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _write_notebook(root: Path, name: str, widget: str, backend: str) -> str:
    nb = json.loads(ASSET.read_text())
    code = next(cell for cell in nb["cells"] if cell["cell_type"] == "code")
    source = "".join(code["source"])
    assert 'BACKEND = "auto"' in source and 'WIDGET = "ClipExplorer"' in source
    source = source.replace('BACKEND = "auto"', f'BACKEND = "{backend}"')
    code["source"] = source.replace('WIDGET = "ClipExplorer"', f'WIDGET = "{widget}"')
    (root / name).write_text(json.dumps(nb))
    return name


PLOT_SIGNATURE = """() => Array.from(document.querySelectorAll('.rlhf-explorer .js-plotly-plot path.js-line'))
    .map(p => p.getAttribute('d')).join('|')"""


# every curve must keep its x: a Plotly.update that sent "undefined" for x once made plotly.js plot
# the curves against their point index (0..600) instead of the ratio (0..3)
CURVES_KEEP_X = """() => Array.from(document.querySelectorAll('.rlhf-explorer .js-plotly-plot')).every(gd =>
    gd.data.filter(t => t.type === 'scatter' && t.y && t.y.length > 1)
           .every(t => t.x && t.x.length === t.y.length))"""
X_RANGE = "() => document.querySelector('.rlhf-explorer .js-plotly-plot')._fullLayout.xaxis.range"


def _open_and_run(page, lab: dict, name: str) -> None:
    """Open a notebook in JupyterLab, run its code cell, wait until the explorer's plot is drawn."""
    page.goto(f"{lab['url']}/lab/tree/{name}?token={lab['token']}&reset")
    page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell .cm-content", timeout=WAIT_MS)
    # run the code cell once the kernel is connected: the status bar reads "<kernel name> | Idle"
    # (the toolbar's execution indicator already says idle before the kernel has even started)
    page.wait_for_function(
        "() => /\\| Idle/.test(document.querySelector('.jp-StatusBar-Widget')?.innerText ?? '')",
        timeout=WAIT_MS)
    page.click(".jp-NotebookPanel .jp-CodeCell .cm-content")
    page.keyboard.press("Shift+Enter")
    try:
        page.wait_for_function(f"() => ({PLOT_SIGNATURE})().length > 0", timeout=WAIT_MS)
    except Exception as err:  # say what the page shows instead of only "timeout"
        shot = Path(lab["root"]) / f"{name}.failure.png"
        page.screenshot(path=str(shot), full_page=True)
        outputs = page.locator(".jp-NotebookPanel .jp-OutputArea").all_inner_texts()
        raise AssertionError(f"the explorer's plot did not render ({err}); outputs: {outputs}; "
                             f"screenshot: {shot}") from None


def _screenshot(page, path: Path) -> None:
    """The explorer, cropped on the right at its figure (the widget box spans the whole cell)."""
    box = page.locator(".rlhf-explorer").first.bounding_box()
    plot = page.locator(".rlhf-explorer .js-plotly-plot .main-svg").first.bounding_box()
    width = min(box["width"], plot["x"] + plot["width"] - box["x"] + 12)
    page.screenshot(path=str(path), full_page=True,
                    clip={"x": box["x"], "y": box["y"], "width": width, "height": box["height"]})


@pytest.mark.parametrize("backend", ["figurewidget", "output"])
def test_clip_explorer_renders_and_responds_to_the_slider(lab, browser, backend, tmp_path) -> None:
    name = _write_notebook(lab["root"], f"clip_{backend}.ipynb", "ClipExplorer", backend)
    page = browser.new_page(viewport={"width": 1600, "height": 1200})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    try:
        _open_and_run(page, lab, name)
        explorer = page.locator(".rlhf-explorer")
        assert "case 3" in explorer.locator(".rlhf-status").inner_text()  # A > 0, ratio 1.3 > 1 + eps
        # the title text comes from the figure itself, so it proves the plotted state
        page.wait_for_selector(".rlhf-explorer .gtitle", timeout=WAIT_MS)
        assert "A = +1" in explorer.locator(".gtitle").text_content()
        assert page.evaluate(CURVES_KEEP_X)
        before = page.evaluate(PLOT_SIGNATURE)
        old_text = explorer.locator(".rlhf-advantage input").input_value()

        handle = explorer.locator(".rlhf-advantage .noUi-handle, .rlhf-advantage .ui-slider-handle").first
        handle.focus()
        for _ in range(30):  # 30 steps of 0.05: A from +1.0 to -0.5
            page.keyboard.press("ArrowLeft")

        page.wait_for_function(f"(old) => ({PLOT_SIGNATURE})() !== old", arg=before, timeout=WAIT_MS)
        page.wait_for_function(
            "() => document.querySelector('.rlhf-explorer .gtitle').textContent.includes('A = -0.5')",
            timeout=WAIT_MS)
        assert explorer.locator(".rlhf-advantage input").input_value() != old_text
        assert page.evaluate(CURVES_KEEP_X), "a curve lost its x after the update"
        low, high = page.evaluate(X_RANGE)
        assert -0.5 < low < 0.5 and 2.5 < high < 3.5, f"x axis spans {low}..{high}, not the ratio grid"
        assert "case" in explorer.locator(".rlhf-status").inner_text()
        assert not errors, f"JavaScript errors on the page: {errors}"

        shot = tmp_path / f"clip_explorer_{backend}.png"
        _screenshot(page, shot)
        assert shot.stat().st_size > 10_000
        if WRITE_SCREENSHOTS and backend == "figurewidget":
            # back to the default state for the README picture
            for _ in range(30):
                page.keyboard.press("ArrowRight")
            page.wait_for_function(f"(old) => ({PLOT_SIGNATURE})() === old", arg=before, timeout=WAIT_MS)
            _screenshot(page, ROOT / "docs" / "img" / "clip_explorer.png")
    finally:
        page.close()


@pytest.mark.skipif(not WRITE_SCREENSHOTS, reason="writes docs/img/gae_explorer.png only with RLHF_WRITE_SCREENSHOTS=1")
def test_gae_explorer_screenshot(lab, browser) -> None:
    name = _write_notebook(lab["root"], "gae.ipynb", "GAEExplorer", "figurewidget")
    page = browser.new_page(viewport={"width": 1600, "height": 1400})
    try:
        _open_and_run(page, lab, name)
        _screenshot(page, ROOT / "docs" / "img" / "gae_explorer.png")
    finally:
        page.close()
