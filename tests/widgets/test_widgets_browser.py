"""The explorers in a real browser: JupyterLab 4 on localhost, driven in headless Chromium.

Two JupyterLab servers start on random free ports with token auth and their own temporary config,
data, runtime, settings and workspace folders (nothing of the user's is read or written); Playwright
(pip package; Debian's /usr/bin/chromium, no browser download) opens
tests/browser_assets/explorer.ipynb, runs it, checks the plotly figure rendered, moves the advantage
slider with the keyboard, and checks the plot changed.

- `lab`: JupyterLab as installed, with plotly's renderer extension, every request off localhost
  refused (offline). Every backend must render and update there; "html" is first drawn by that
  extension from the plotly JSON, then its updates (HTML) use the plotly.js the extension loaded.
  For each backend a screenshot goes to a temporary folder; with RLHF_WRITE_SCREENSHOTS=1 the
  figurewidget run also writes docs/img/clip_explorer.png (and the GAE explorer
  docs/img/gae_explorer.png) for the README.
- `colab_like_lab`: the failure mode of Colab (googlecolab/colabtools#5889), reproduced. plotly's
  extension is disabled (`jupyter labextension disable jupyterlab-plotly` in the server's own
  config folder), the kernel uses plotly's "colab" renderer (PLOTLY_RENDERER=colab, as Colab sets
  it) and the notebook marks itself as running in Colab (a `google.colab` module), so the explorers
  pick their backend as in Colab. There is no internet here: plotly.js requests to plotly's CDN are
  answered by Playwright (`page.route`) with the plotly.min.js of the installed plotly package,
  which stands in for Colab's network access. The old "output" backend must show no plot there (its
  HTML calls Plotly before the CDN script has loaded: "Plotly is not defined"); "auto" must pick
  "html", show the plot, fetch plotly.js once, and update that one plot in place when the slider
  moves.

Skipped with a reason when chromium or playwright is missing, except when CI=true: then it fails.
"""

from __future__ import annotations

import contextlib
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

from rlhf_helpers.widgets import html_figure

ROOT = Path(__file__).resolve().parents[2]
ASSET = ROOT / "tests" / "browser_assets" / "explorer.ipynb"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WRITE_SCREENSHOTS = os.environ.get("RLHF_WRITE_SCREENSHOTS") == "1"
WAIT_MS = 90_000  #: longest wait for one selector (a cold kernel start on a busy 2-core machine)
#: plotly's JupyterLab renderer extension (mime type + widget)
PLOTLY_EXTENSION = "jupyterlab-plotly"

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


@contextlib.contextmanager
def _jupyterlab(base: Path, plotly_extension: bool, kernel_env: dict[str, str],
                settings: dict[str, dict] | None = None,
                server_args: tuple[str, ...] = ()) -> Iterator[dict]:
    """A JupyterLab server on 127.0.0.1 with its own Jupyter folders under `base`; yields url,
    token, root and log. `plotly_extension=False` disables plotly's renderer extension in its config
    folder; `settings` maps a plugin ("@jupyterlab/notebook-extension/tracker") to user settings of
    its own; `server_args` are more command-line options for the server."""
    root = base / "root"
    root.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **kernel_env}
    for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                     ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                     ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                     ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")]:
        (base / sub).mkdir()
        env[var] = str(base / sub)
    # no "get notified about Jupyter news?" toast over the widget (and no request for news)
    notification = (base / "settings" / "@jupyterlab" / "apputils-extension"
                    / "notification.jupyterlab-settings")
    notification.parent.mkdir(parents=True)
    notification.write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}))
    for plugin, values in (settings or {}).items():
        package, _, name = plugin.rpartition("/")
        (base / "settings" / package).mkdir(parents=True, exist_ok=True)
        (base / "settings" / package / f"{name}.jupyterlab-settings").write_text(json.dumps(values))
    env.pop("RLHF_WIDGETS_BACKEND", None)  # the notebook names its backend
    if not plotly_extension:  # --level=user: the JUPYTER_CONFIG_DIR above, not the environment's
        subprocess.run([sys.executable, "-m", "jupyterlab.labextensions", "disable", "--level=user",
                        PLOTLY_EXTENSION], env=env, check=True, capture_output=True, timeout=60)
    port, token = _free_port(), os.urandom(16).hex()
    log = open(base / "server.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly",  # no PyPI look-ups (CI has no internet)
         *server_args,
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                pytest.fail(
                    f"JupyterLab exited early:\n{(base / 'server.log').read_text()[-3000:]}")
            try:
                _get_json(f"{url}/api/status?token={token}")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"JupyterLab did not start:\n{(base / 'server.log').read_text()[-3000:]}")
                time.sleep(0.3)
        yield {"url": url, "token": token, "root": root, "log": base / "server.log",
               "plotly_extension": plotly_extension}
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def lab(browser_ready, tmp_path_factory) -> Iterator[dict]:
    """JupyterLab as a learner installs it: plotly's renderer extension enabled."""
    with _jupyterlab(tmp_path_factory.mktemp("lab"), plotly_extension=True,
                     kernel_env={}) as server:
        yield server


@pytest.fixture(scope="module")
def colab_like_lab(browser_ready, tmp_path_factory) -> Iterator[dict]:
    """JupyterLab without plotly's renderer extension, the kernel on plotly's "colab" renderer."""
    with _jupyterlab(tmp_path_factory.mktemp("colab_like_lab"), plotly_extension=False,
                     kernel_env={"PLOTLY_RENDERER": "colab"}) as server:
        yield server


@pytest.fixture(scope="module")
def browser(browser_ready) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=shutil.which("chromium") or CHROMIUM,
                                     headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _write_notebook(root: Path, name: str, widget: str, backend: str, colab: bool = False) -> str:
    """The asset notebook with its BACKEND and WIDGET set; `colab=True` also registers a stand-in
    `google.colab` module first, which is how the explorers recognise Colab."""
    nb = json.loads(ASSET.read_text())
    code = next(cell for cell in nb["cells"] if cell["cell_type"] == "code")
    source = "".join(code["source"])
    assert 'BACKEND = "auto"' in source and 'WIDGET = "ClipExplorer"' in source
    source = source.replace('BACKEND = "auto"', f'BACKEND = "{backend}"')
    source = source.replace('WIDGET = "ClipExplorer"', f'WIDGET = "{widget}"')
    if colab:
        source = ('import sys, types\nsys.modules["google.colab"] = '
                  'types.ModuleType("google.colab")\n' + source)
    code["source"] = source
    (root / name).write_text(json.dumps(nb))
    return name


#: the explorer's figure, inside its widget or not ("html")
PLOTS = ".jp-NotebookPanel .js-plotly-plot"
PLOT_SIGNATURE = f"""() => Array.from(document.querySelectorAll('{PLOTS} path.js-line'))
    .map(p => p.getAttribute('d')).join('|')"""
PLOT_COUNT = f"() => document.querySelectorAll('{PLOTS}').length"
TITLE = f"() => document.querySelector('{PLOTS} .gtitle')?.textContent ?? ''"


# every curve must keep its x: a Plotly.update that sent "undefined" for x once made plotly.js plot
# the curves against their point index (0..600) instead of the ratio (0..3)
CURVES_KEEP_X = f"""() => Array.from(document.querySelectorAll('{PLOTS}')).every(gd =>
    gd.data.filter(t => t.type === 'scatter' && t.y && t.y.length > 1)
           .every(t => t.x && t.x.length === t.y.length))"""
X_RANGE = f"() => document.querySelector('{PLOTS}')._fullLayout.xaxis.range"


def _serve_plotly_cdn(page) -> list[str]:
    """Answer requests for plotly's CDN with the installed plotly.min.js (there is no internet
    here; in Colab the browser fetches the same file from the CDN) and refuse every other request
    that leaves localhost. Returns the list of CDN URLs requested, filled as the page runs."""
    import plotly

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    requested: list[str] = []

    def fulfil(route) -> None:
        requested.append(route.request.url)
        route.fulfill(path=str(plotly_js), content_type="application/javascript")

    _refuse_internet(page)
    page.route("https://cdn.plot.ly/**", fulfil)  # added last, so it comes first
    return requested


def _refuse_internet(page) -> None:
    """Abort every request that leaves localhost (routes added later take precedence)."""
    page.route(lambda url: not url.startswith("http://127.0.0.1"), lambda route: route.abort())


def _open_and_run(page, lab: dict, name: str, expect_plot: bool = True) -> None:
    """Open a notebook in JupyterLab, run its code cell, wait until the explorer's plot is drawn
    (or, with `expect_plot=False`, until its controls and status line are)."""
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
        if expect_plot:
            page.wait_for_function(f"() => ({PLOT_SIGNATURE})().length > 0", timeout=WAIT_MS)
        else:
            page.wait_for_function(
                "() => /case/.test(document.querySelector('.rlhf-explorer "
                ".rlhf-status')?.innerText ?? '')",
                timeout=WAIT_MS)
    except Exception as err:  # say what the page shows instead of only "timeout"
        shot = Path(lab["root"]) / f"{name}.failure.png"
        page.screenshot(path=str(shot), full_page=True)
        outputs = page.locator(".jp-NotebookPanel .jp-OutputArea").all_inner_texts()
        raise AssertionError(f"the explorer did not render ({err}); outputs: {outputs}; "
                             f"screenshot: {shot}") from None


def _screenshot(page, path: Path) -> None:
    """The explorer's controls and its figure (below them, or inside their box), cropped on the
    right at the figure (the widget box spans the whole cell)."""
    box = page.locator(".rlhf-explorer").first.bounding_box()
    plot = page.locator(f"{PLOTS} .main-svg").first.bounding_box()
    bottom = max(box["y"] + box["height"], plot["y"] + plot["height"])
    width = min(box["width"], plot["x"] + plot["width"] - box["x"] + 12)
    page.screenshot(path=str(path), full_page=True,
                    clip={"x": box["x"], "y": box["y"], "width": width,
                          "height": bottom - box["y"] + 8})


def _drag_advantage_and_check(page, before: str) -> None:
    """Move the advantage slider from +1 to -0.5 with the keyboard; the plot must follow."""
    explorer = page.locator(".rlhf-explorer")
    old_text = explorer.locator(".rlhf-advantage input").input_value()
    handle = explorer.locator(
        ".rlhf-advantage .noUi-handle, .rlhf-advantage .ui-slider-handle").first
    handle.focus()
    for _ in range(30):  # 30 steps of 0.05: A from +1.0 to -0.5
        page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"(old) => ({PLOT_SIGNATURE})() !== old", arg=before, timeout=WAIT_MS)
    page.wait_for_function(f"() => ({TITLE})().includes('A = -0.5')", timeout=WAIT_MS)
    assert explorer.locator(".rlhf-advantage input").input_value() != old_text
    assert page.evaluate(CURVES_KEEP_X), "a curve lost its x after the update"
    low, high = page.evaluate(X_RANGE)
    assert -0.5 < low < 0.5 and 2.5 < high < 3.5, f"x axis spans {low}..{high}, not the ratio grid"
    assert "case" in explorer.locator(".rlhf-status").inner_text()
    assert page.evaluate(PLOT_COUNT) == 1, "the update added a figure instead of replacing it"


@pytest.mark.parametrize("backend", ["figurewidget", "output", "html"])
def test_clip_explorer_renders_and_responds_to_the_slider(lab, browser, backend, tmp_path) -> None:
    name = _write_notebook(lab["root"], f"clip_{backend}.ipynb", "ClipExplorer", backend)
    page = browser.new_page(viewport={"width": 1600, "height": 1200})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    # every backend must work offline here; "html" draws its first figure with plotly's extension
    # (from the JSON), then its updates are HTML drawn with the plotly.js that extension put on the
    # page
    _refuse_internet(page)
    try:
        _open_and_run(page, lab, name)
        explorer = page.locator(".rlhf-explorer")
        # A > 0, ratio 1.3 > 1 + eps
        assert "case 3" in explorer.locator(".rlhf-status").inner_text()
        # the title text comes from the figure itself, so it proves the plotted state
        page.wait_for_function(f"() => ({TITLE})().includes('A = +1')", timeout=WAIT_MS)
        assert page.evaluate(CURVES_KEEP_X)
        if backend == "html":  # drawn by plotly's extension from the JSON, not by the HTML's script
            assert page.locator(".jp-NotebookPanel .jp-RenderedPlotly.js-plotly-plot").count() == 1
            assert page.locator(".jp-NotebookPanel .rlhf-figure").count() == 0
        _drag_advantage_and_check(page, page.evaluate(PLOT_SIGNATURE))
        if backend == "html":  # the updates are the HTML (no CDN needed: see above)
            assert page.locator(".jp-NotebookPanel .rlhf-figure.js-plotly-plot").count() == 1
        assert not errors, f"JavaScript errors on the page: {errors}"

        shot = tmp_path / f"clip_explorer_{backend}.png"
        _screenshot(page, shot)
        assert shot.stat().st_size > 10_000
        if WRITE_SCREENSHOTS and backend == "figurewidget":
            # back to the default state for the README picture
            before = page.evaluate(PLOT_SIGNATURE)
            for _ in range(30):
                page.keyboard.press("ArrowRight")
            page.wait_for_function(f"(old) => ({PLOT_SIGNATURE})() !== old",
                                   arg=before, timeout=WAIT_MS)
            page.wait_for_function(f"() => ({TITLE})().includes('A = +1')", timeout=WAIT_MS)
            _screenshot(page, ROOT / "docs" / "img" / "clip_explorer.png")
    finally:
        page.close()


def _plotly_extension_disabled(page) -> bool:
    """Whether the running JupyterLab page lists plotly's extension as disabled."""
    config = json.loads(page.locator("#jupyter-config-data").text_content())
    return PLOTLY_EXTENSION in json.dumps(config.get("disabledExtensions", []))


def test_output_backend_shows_no_plot_without_plotly_renderer(colab_like_lab, browser) -> None:
    """The failure mode of googlecolab/colabtools#5889: a plotly figure inside an Output widget."""
    name = _write_notebook(colab_like_lab["root"], "clip_output_colab.ipynb", "ClipExplorer",
                           "output", colab=True)
    page = browser.new_page(viewport={"width": 1600, "height": 1200})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    requested = _serve_plotly_cdn(page)
    try:
        _open_and_run(page, colab_like_lab, name, expect_plot=False)
        assert _plotly_extension_disabled(page)
        # the Output widget got plotly's "colab" HTML, and its script ran (it asked for plotly.js)
        # ...
        page.wait_for_function(
            "() => document.querySelector('.rlhf-explorer .plotly-graph-div') !== null",
            timeout=WAIT_MS)
        page.wait_for_function("() => window.Plotly !== undefined", timeout=WAIT_MS)
        # ... and plotly.js is loaded now: a late draw would show by then
        page.wait_for_timeout(1000)
        assert requested, "the Output widget's HTML never asked for plotly.js"
        # ... but nothing was drawn: the inline Plotly.newPlot ran before the CDN script had loaded
        assert page.evaluate(PLOT_COUNT) == 0
        assert page.evaluate(f"() => ({PLOT_SIGNATURE})()") == ""
        assert any("Plotly is not defined" in e for e in errors), errors
    finally:
        page.close()


def test_html_backend_renders_and_updates_without_plotly_renderer(colab_like_lab, browser,
                                                                  tmp_path) -> None:
    """What Colab gets: "auto" picks "html", which draws and redraws with no plotly renderer."""
    name = _write_notebook(colab_like_lab["root"], "clip_auto_colab.ipynb", "ClipExplorer", "auto",
                           colab=True)
    page = browser.new_page(viewport={"width": 1600, "height": 1200})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    requested = _serve_plotly_cdn(page)
    try:
        _open_and_run(page, colab_like_lab, name)
        assert _plotly_extension_disabled(page)
        explorer = page.locator(".rlhf-explorer")
        assert "case 3" in explorer.locator(".rlhf-status").inner_text()
        page.wait_for_function(f"() => ({TITLE})().includes('A = +1')", timeout=WAIT_MS)
        # our HTML drew it
        assert page.locator(".jp-NotebookPanel .rlhf-figure.js-plotly-plot").count() == 1
        assert page.evaluate(CURVES_KEEP_X)
        _drag_advantage_and_check(page, page.evaluate(PLOT_SIGNATURE))
        assert requested == [html_figure.plotly_js_url()], "plotly.js must be fetched once per page"
        assert not errors, f"JavaScript errors on the page: {errors}"
        shot = tmp_path / "clip_explorer_html_colab_like.png"
        _screenshot(page, shot)
        assert shot.stat().st_size > 10_000
    finally:
        page.close()


@pytest.mark.skipif(not WRITE_SCREENSHOTS,
                    reason="writes docs/img/gae_explorer.png only with RLHF_WRITE_SCREENSHOTS=1")
def test_gae_explorer_screenshot(lab, browser) -> None:
    name = _write_notebook(lab["root"], "gae.ipynb", "GAEExplorer", "figurewidget")
    page = browser.new_page(viewport={"width": 1600, "height": 1400})
    try:
        _open_and_run(page, lab, name)
        _screenshot(page, ROOT / "docs" / "img" / "gae_explorer.png")
    finally:
        page.close()
