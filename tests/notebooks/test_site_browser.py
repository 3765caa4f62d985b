"""The static site (`make site`, build/site/) in headless Chromium, offline: every page, one browser
tab.

The site is served from 127.0.0.1; every request that leaves it is refused and counted. For every
page:

- no console error, no uncaught exception, no failed request and no answer >= 400 (so nothing comes
  from a CDN: plotly.js and MathJax are the site's own);
- every plotly figure draws (its main svg and at least one drawn trace);
- every formula is typeset by MathJax 3, without a TeX error, and none shows as raw TeX before it is
  typeset;
- at 1400 px and at 390 px (a phone), none of the defects tests/site_defects.py counts: a formula
  cut off, a table whose columns cannot be reached, a figure with a label cut or run into another or
  under the toolbar, an explorer whose sliders are off-screen, out of sight of their curves or
  covered; each check is shown to find a page broken on purpose;
- every internal link (no scheme) names a file of the site, and its #anchor an id in that file
  (links to GitHub, the repository button's among them, are only hrefs: nothing is requested from
  there);
- one search field at the top of the page (the sidebar's), and the header's link to the repository.

Each explorer (a plotly figure whose sliders were computed in advance,
rlhf_helpers/widgets/static_explorer.py) is moved by a mouse click on one step of each slider: the
figure must change, and the y-values it then draws must equal what the maths core computes for those
values (tests/notebooks/test_site.py, `expected_traces`).

`make test` builds the site after the notebook tests and then runs this file (marker `site`).
Skipped with a reason when chromium, playwright or the site is missing, except on CI (CI=true),
where that fails.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import numpy as np
import pytest
from figure_overlaps import OVERLAPS
from site_defects import CUT_FORMULAS, EXPLORER_DEFECTS, FIGURE_DEFECTS, UNREACHABLE_TABLES
from test_site import GITHUB, TOLERANCE, expected_traces
from test_widgets_browser import browser, browser_ready  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "site"
VIEWPORT = {"width": 1400, "height": 1000}
WAIT_MS = 30_000  #: longest wait for a page's figures or maths
FIGURES = ".rlhf-site-figure, .rlhf-static-explorer"
#: the explorers each page shows (03: KL and GAE; 04: clip, clip with a batch, value clip; 05: clip
#: with a batch)
EXPLORERS = {"notebooks/03_gae.html": 2, "notebooks/04_clip_loss.html": 3,
             "notebooks/05_full_ppo.html": 1}

pytestmark = [pytest.mark.site, pytest.mark.browser, pytest.mark.timeout(300)]


def _pages() -> list[str]:
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html")
                  if "_static" not in p.parts)


@pytest.fixture(scope="module")
def site(browser_ready) -> Iterator[str]:  # noqa: F811 (the imported fixture)
    """build/site/ over HTTP on 127.0.0.1 (a thread of this process); yields its base URL."""
    if not (SITE / "index.html").is_file():
        reason = f"{SITE}/index.html is missing: build the site first (make site)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def tab(browser, site) -> Iterator[tuple[object, dict]]:  # noqa: F811 (the imported fixture)
    """One browser tab for the whole site, and the problems it reports, by the page they belong to
    (problems["page"] names the page being visited: a font still loading when the tab moves on is
    aborted by the browser, which is no fault of the next page)."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    problems: dict = {"page": None, "console": [], "requests": []}
    started: dict[object, str] = {}  # request -> the URL of the document that made it

    def failed(request) -> None:
        made_here = started.get(request, "").split("#")[0] == site + str(problems["page"])
        if made_here or request.failure != "net::ERR_ABORTED":
            problems["requests"].append(f"{request.url} ({request.failure})")

    page.on("console",
            lambda msg: problems["console"].append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda err: problems["console"].append(f"uncaught: {err}"))
    page.on("request", lambda request: started.__setitem__(request, request.frame.url))
    page.on("requestfailed", failed)
    page.on("response", lambda r: problems["requests"].append(f"{r.url} ({r.status})")
            if r.status >= 400 else None)
    # offline
    page.route(lambda url: not url.startswith(site), lambda route: route.abort("blockedbyclient"))
    yield page, problems
    context.close()


#: every figure drawn: its main svg, and a drawn trace (a path or a bar) in it
DRAWN = (f"""() => Array.from(document.querySelectorAll('{FIGURES}')).map(gd =>
    !!gd.querySelector('.main-svg')"""
         " && gd.querySelectorAll('.trace path, .trace .point, .box path').length > 0)")
#: MathJax 3 done: every formula Sphinx wrote (.math.notranslate) holds its rendering, and the page
#: shows them
MATH = ("""() => {
    const maths = Array.from(document.querySelectorAll('.math.notranslate'));
    const typeset = maths.filter(m => m.querySelector('mjx-container')).length;
"""
    "    return {done: typeset === maths.length"
    " && !document.documentElement.classList.contains('rlhf-math-pending'),\n"
    """            count: typeset, errors: document.querySelectorAll('mjx-merror').length};
}""")
#: every figure laid out for the width it is drawn at (site/static/rlhf-figures.js marks it)
FITTED = (f"() => Array.from(document.querySelectorAll('{FIGURES}'))"
          ".every(gd => gd.hasAttribute('data-fitted'))")
LINKS = "() => Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))"
#: what a reader cannot see without the page hiding it: a table or an output line cut by an element
#: that hides its overflow (none may be: long ones wrap or scroll), and the page wider than the
#: window (on a phone a long line widens the whole page), naming the element that widens it
#: (formulas: site_defects.CUT_FORMULAS)
CLIPPED = ("""() => {
    const out = [];
    document.querySelectorAll('article table, article pre').forEach((t, i) => {
        const width = t.getBoundingClientRect().width;
        for (let a = t; a && a !== document.body; a = a.parentElement) {
            const o = getComputedStyle(a).overflowX;
            if (o === 'auto' || o === 'scroll') break;
            const over = a === t ? a.scrollWidth > a.clientWidth + 1 : width > a.clientWidth + 1;
            if ((o === 'hidden' || o === 'clip') && over) {
"""
    "                out.push(t.tagName.toLowerCase() + ' ' + i + ': '"
    " + t.textContent.trim().slice(0, 60)); break;\n"
    """            }
        }
    });
    const view = window.innerWidth;
    if (document.documentElement.scrollWidth > view + 1) {
        const wide = Array.from(document.querySelectorAll('body *')).filter(e => {
            if (e.getBoundingClientRect().right <= view + 1) return false;
            for (let a = e.parentElement; a; a = a.parentElement) {
                if (getComputedStyle(a).overflowX !== 'visible') return false;
            }
            return true;
        }).map(e => e.tagName.toLowerCase() + ' "' + e.textContent.slice(0, 40) + '"');
        const width = document.documentElement.scrollWidth;
        out.push('page ' + width + ' px wide in ' + view + ': ' + wide.slice(-3).join(', '));
    }
    return out;
}""")
#: a phone's window (the widths a learner reads the site at: VIEWPORT and this)
PHONE = {"width": 390, "height": 844}


def site_defects(page) -> dict[str, list[str]]:
    """What tests/site_defects.py counts on the page as it is now, by rule (empty lists: none)."""
    found = {name: page.evaluate(js) for name,
             js in (("formulas", CUT_FORMULAS), ("tables", UNREACHABLE_TABLES),
                    ("figures", FIGURE_DEFECTS), ("explorers", EXPLORER_DEFECTS))}
    return {name: lines for name, lines in found.items() if lines}


def _settled(page, name: str) -> None:
    """Wait until the page's figures are drawn and fitted to its width and its maths is typeset."""
    try:
        page.wait_for_function(f"() => ({DRAWN})().every(Boolean) && ({FITTED})()", timeout=WAIT_MS)
        page.wait_for_function(f"() => ({MATH})().done", timeout=WAIT_MS)
    except Exception:  # say what is missing instead of only "timeout"
        raise AssertionError(f"{name}: figures drawn {page.evaluate(DRAWN)}, fitted "
                             f"{page.evaluate(FITTED)}, maths {page.evaluate(MATH)}") from None


@functools.cache
def _ids(path: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', path.read_text(encoding="utf-8")))


def broken_links(page_url: str, hrefs: list[str], site_url: str) -> list[str]:
    """The hrefs of a page that leave no scheme but name no file of the site (or no id in it)."""
    broken = []
    for href in hrefs:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", href) or href in ("", "#"):
            continue  # external (http, mailto, javascript) or a bare "#" button
        url = urljoin(page_url, href)
        if not url.startswith(site_url):
            broken.append(f"{href} (outside the site)")
            continue
        parts = urlsplit(url)
        target = SITE / unquote(parts.path[len(urlsplit(site_url).path):])
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            broken.append(href)
        elif (parts.fragment and target.suffix == ".html"
              and unquote(parts.fragment) not in _ids(target)):
            broken.append(f"{href} (no such anchor)")
    return broken


@pytest.mark.parametrize("name", _pages() or ["index.html"])
def test_page_loads_offline_draws_everything_and_its_explorers_move(tab, site, name: str) -> None:
    page, problems = tab
    problems.update(page=name, console=[], requests=[])
    page.goto(site + name, wait_until="load")
    _settled(page, name)
    maths = page.evaluate(MATH)
    assert maths["errors"] == 0, f"{name}: {maths['errors']} formulas with a TeX error"
    clipped = page.evaluate(CLIPPED)
    assert not clipped, f"{name} at {VIEWPORT['width']} px: cut off or too wide: {clipped}"
    defects = site_defects(page)
    assert not defects, f"{name} at {VIEWPORT['width']} px: {defects}"
    if name.startswith("notebooks/0"):
        assert (page.evaluate(f"() => document.querySelectorAll('{FIGURES}').length")
                > 0), f"{name}: no figure"
        assert maths["count"] > 0, f"{name}: no typeset formula"
    hrefs = page.evaluate(LINKS)
    assert not broken_links(site + name, hrefs, site), f"{name}: broken links"
    button = page.locator(f'a.btn-source-repository-button[href="{GITHUB}"]:visible').count()
    assert button == 1, f"{name}: {button} repository buttons shown"
    # the sidebar's; no header strip with another
    fields = page.locator(".search-button-field:visible").count()
    assert fields == 1, f"{name}: {fields} search fields shown at {VIEWPORT}"
    header = page.evaluate("() => { const h = document.querySelector('#pst-header'); "
                           "return h ? h.getBoundingClientRect().height : 0; }")
    assert header == 0, f"{name}: a {header} px header strip above the page"
    explorers = page.evaluate("() => document.querySelectorAll('.rlhf-static-explorer').length")
    assert explorers == EXPLORERS.get(name, 0), f"{name}: {explorers} explorers"
    for index in range(explorers):
        _move_every_slider(page, name, index)
    assert not problems["console"], f"{name}: console errors {problems['console']}"
    assert not problems["requests"], f"{name}: failed requests {problems['requests']}"


@pytest.fixture(scope="module")
def phone(browser, site) -> Iterator[object]:  # noqa: F811 (the imported fixture)
    """One tab at a phone's width, offline like `tab`."""
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    page.route(lambda url: not url.startswith(site), lambda route: route.abort("blockedbyclient"))
    yield page
    context.close()


@pytest.mark.parametrize("name", _pages() or ["index.html"])
def test_on_a_phone_nothing_is_cut_off_hidden_or_covered_and_the_page_keeps_its_width(
        phone, site, name: str) -> None:
    phone.goto(site + name, wait_until="load")
    _settled(phone, name)
    clipped = phone.evaluate(CLIPPED)
    assert not clipped, f"{name} at {PHONE['width']} px: cut off or too wide: {clipped}"
    defects = site_defects(phone)
    assert not defects, f"{name} at {PHONE['width']} px: {defects}"


def test_the_clipping_check_sees_a_cut_table_and_a_widened_page(phone) -> None:
    """CLIPPED on pages broken on purpose: a table in an overflow-hidden box and an unbreakable line
    that widens the page; and on the same page fixed, nothing."""
    wide = "x" * 300
    broken = ('<article><div '
              f'style="overflow:hidden;width:200px"><table><tr><td>{wide}</td></tr></table></div>'
              f'<p style="white-space:nowrap">{wide}</p></article>')
    phone.set_content(broken)
    found = phone.evaluate(CLIPPED)
    assert [f.split(" ")[0] for f in found] == ["table", "page"], found
    phone.set_content(
        broken.replace("overflow:hidden", "overflow:auto").replace("white-space:nowrap",
                                                                                "overflow-wrap:anywhere"))
    assert phone.evaluate(CLIPPED) == []


def test_the_overlap_check_sees_subplot_titles_run_into_each_other_until_they_are_wrapped(
        tab, site) -> None:
    """Three long subplot titles side by side in the text column collide; `fit_labels` wraps them
    apart."""
    from plotly.subplots import make_subplots

    from rlhf_helpers.widgets.style import fit_labels, use_course_figure_style

    use_course_figure_style()
    page, problems = tab
    problems.update(page="notebooks/05_full_ppo.html", console=[], requests=[])
    page.goto(site + "notebooks/05_full_ppo.html", wait_until="load")  # a page with plotly.js
    titles = ("ratio mean, first minibatch of each step",
              "clip fraction (mean over the update)", "approx-KL")
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles)
    for col in (1, 2, 3):
        fig.add_scatter(x=[0, 1], y=[0, 1], row=1, col=col, showlegend=False)
    draw = f"""async figure => {{
        const gd = document.createElement('div');
        gd.style.width = '784px';
        document.querySelector('article').prepend(gd);
        await Plotly.newPlot(gd, figure.data, figure.layout);
        const found = ({OVERLAPS})(gd);
        gd.remove();
        return found;
    }}"""
    assert page.evaluate(draw,
                         fig.to_plotly_json()), "side-by-side long subplot titles should collide"
    assert page.evaluate(draw, fit_labels(fig).to_plotly_json()) == []


#: a figure laid out for a notebook's output area: a long title, three panels side by side with long
#: titles, and a legend at the right: drawn as it is at 390 px it is cut and its labels collide;
#: drawn by rlhfFigures it fits
_WIDE_FIGURE = (
    "{\n"
    "  data: [1, 2, 3].map(k => ({x: [0, 1, 2], y: [0, k, 2 * k],"
    " name: 'a long legend entry number ' + k,\n"
    "                              xaxis: 'x' + (k > 1 ? k : ''),"
    " yaxis: 'y' + (k > 1 ? k : '')})),\n"
    "  layout: {title: {text: 'A long figure title that a phone cannot show on one line at all',"
    " x: 0.02},\n"
    "           height: 420, margin: {l: 60, r: 24, t: 64, b: 56},\n"
    "           xaxis: {domain: [0, 0.28], anchor: 'y',"
    " title: {text: 'first step size of the run'}},\n"
    "           xaxis2: {domain: [0.36, 0.64], anchor: 'y2',"
    " title: {text: 'first step size of the run'}},\n"
    "           xaxis3: {domain: [0.72, 1], anchor: 'y3',"
    " title: {text: 'first step size of the run'}},\n"
    "           yaxis: {anchor: 'x'}, yaxis2: {anchor: 'x2'}, yaxis3: {anchor: 'x3'},\n"
    "           annotations: [[0.14, 'ratio mean over the first minibatch'],"
    " [0.5, 'clip fraction, mean over the update'],\n"
    "                         [0.86, 'approx-KL between old and new']].map(([x, text]) => ({\n"
    "             text, x, y: 1, xref: 'paper', yref: 'paper', xanchor: 'center',"
    " yanchor: 'bottom', showarrow: false,\n"
    "             font: {size: 16}}))}\n"
    "}")


def _replace_article(page, html: str) -> None:
    page.evaluate("html => { document.querySelector('article').innerHTML = html; "
                  "window.scrollTo(0, 0); }", html)


def test_the_figure_check_sees_a_figure_laid_out_for_a_wider_page_until_it_is_fitted(
        phone, site) -> None:
    # a page with plotly.js and rlhfFigures
    phone.goto(site + "notebooks/05_full_ppo.html", wait_until="load")
    _settled(phone, "05")
    _replace_article(phone,
                     '<div id="t" class="rlhf-site-figure" style="width:100%;height:420px"></div>')
    phone.evaluate(
        f"async () => {{ const f = {_WIDE_FIGURE}; await Plotly.newPlot('t', f.data, f.layout); }}")
    found = phone.evaluate(FIGURE_DEFECTS)
    for kind in ("label cut at the figure's edge", 'subtitle "'):
        assert any(kind in line for line in found), (kind, found)
    phone.evaluate(
        f"async () => {{ const f = {_WIDE_FIGURE}; const gd = document.getElementById('t'); "
        "Plotly.purge(gd); await rlhfFigures.draw(gd, f.data, f.layout); }")
    assert phone.evaluate(FIGURE_DEFECTS) == []


def test_the_explorer_check_sees_sliders_off_screen_far_from_their_curves_or_covered(
        browser, site) -> None:  # noqa: F811
    """The explorers on a phone as they were: 660 px wide in a 358 px column (the sliders' right end
    off-screen), the sliders 900 px under the curves, and a button over the sliders."""
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    page.route(lambda url: not url.startswith(site), lambda route: route.abort("blockedbyclient"))
    try:
        page.route("**/_static/site.css*", lambda route: route.fulfill(
            body=route.fetch().text() + "\n.rlhf-static-explorer { min-width: 660px; }",
            content_type="text/css"))
        page.goto(site + "notebooks/03_gae.html", wait_until="load")
        _settled(page, "03")
        found = page.evaluate(EXPLORER_DEFECTS)
        assert any("outside the window" in line for line in found), found
        page.unroute("**/_static/site.css*")
        page.goto(site + "notebooks/03_gae.html", wait_until="load")
        _settled(page, "03")
        assert page.evaluate(EXPLORER_DEFECTS) == []
        page.evaluate(
            "() => { const gd = document.querySelector('.rlhf-static-explorer');\n"
            "            return Plotly.relayout(gd, {'sliders[0].y': -1.5,"
            " 'sliders[0].yanchor': 'top', 'margin.b': 1100,\n"
            "                                        height: gd.layout.height + 1100}); }")
        assert any("taller than the window" in line for line in page.evaluate(EXPLORER_DEFECTS))
        page.evaluate("""() => { const b = document.createElement('button'); b.id = 'cover';
            b.style.cssText = 'position:fixed;left:0;top:0;width:100vw;height:100vh;opacity:0.5';
            document.body.appendChild(b); }""")
        assert any("covered by button#cover" in line for line in page.evaluate(EXPLORER_DEFECTS))
    finally:
        context.close()


def test_the_table_check_sees_a_long_wide_table_until_it_becomes_cards(phone, site) -> None:
    """A table wider than the column in a box taller than the window: its sideways scrollbar is out
    of sight; as one card per row (static/rlhf-tables.js) it fits. A narrow long table and a wide
    short one are fine as they are."""
    phone.goto(site + "notebooks/NOTATION.html", wait_until="load")
    _settled(phone, "NOTATION")
    rows = "".join(f"<tr><td>{i}</td>{'<td>a few words of text in a cell</td>' * 5}</tr>"
                   for i in range(40))
    head = "<thead><tr><th>n</th>" + "<th>column</th>" * 5 + "</tr></thead>"
    table = ('<div class="pst-scrollable-table-container"><table '
             f'class="table">{head}<tbody>{rows}</tbody>'
             "</table></div>")
    short = table.replace(rows, rows[: rows.index("</tr>") + 5])
    narrow = table.replace("<td>a few words of text in a cell</td>" * 5,
                           "<td>x</td>").replace("<th>column</th>" * 5,
                                                 "<th>c</th>")
    _replace_article(phone, table + short + narrow)
    found = phone.evaluate(UNREACHABLE_TABLES)
    assert len(found) == 1 and found[0].startswith("table 0: its sideways scrollbar"), found
    phone.evaluate("() => rlhfTables.fit()")
    assert phone.evaluate("() => Array.from(document.querySelectorAll('article table')).map(t => "
                          "t.classList.contains('rlhf-cards'))") == [True, False, False]
    assert phone.evaluate(UNREACHABLE_TABLES) == []
    _replace_article(phone,
                     '<div style="overflow:hidden"><table><tr><td style="white-space:nowrap">'
                     + "y" * 200 + "</td></tr></table></div>")
    assert phone.evaluate(UNREACHABLE_TABLES)[0].startswith("table 0 cut by its box")


def test_the_formula_check_sees_an_inline_formula_cut_by_its_box_and_not_one_that_scrolls(
        phone, site) -> None:
    """The theme's rule for inline maths (overflow hidden) cut a long formula on a phone; the site's
    draws it smaller and lets what still does not fit scroll."""
    phone.goto(site + "notebooks/01_policy_gradients.html", wait_until="load")
    _settled(phone, "01")
    formula = r"\(" + " + ".join(f"x_{{{i}}}" for i in range(60)) + r"\)"
    for style, cut in (("overflow:hidden", True), ("", False)):
        _replace_article(phone, '<p><span class="math notranslate nohighlight" '
                                f'style="{style}">{formula}</span></p>')
        phone.evaluate(
            "async () => { await MathJax.typesetPromise([document.querySelector('article')]); "
            "rlhfMath.fit(); }")
        found = phone.evaluate(CUT_FORMULAS)
        assert bool(found) == cut and all(line.startswith("inline formula 0 cut by its box")
                                          for line in found), found


def test_no_formula_shows_as_raw_tex_until_mathjax_has_typeset_it(browser, site) -> None:  # noqa: F811
    """With MathJax held back, every formula stays hidden (raw TeX never shows) until the page gives
    up waiting (static/rlhf-math.js, MATH_WAIT_MS) and shows the TeX rather than nothing."""
    script = (ROOT / "site" / "static" / "rlhf-math.js").read_text(encoding="utf-8")
    wait_ms = int(re.search(r"MATH_WAIT_MS = (\d+);", script).group(1))
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    try:
        page.route(lambda url: not url.startswith(site) or "/mathjax/" in url,
                   lambda route: route.abort("blockedbyclient"))
        page.goto(site + "notebooks/03_gae.html", wait_until="load")
        shown = ("() => Array.from(document.querySelectorAll('.math')).map(m => "
                 "getComputedStyle(m).visibility)")
        before = page.evaluate(shown)
        assert before and set(before) == {"hidden"}, set(before)
        page.wait_for_timeout(wait_ms + 500)
        assert set(page.evaluate(shown)) == {"visible"}
    finally:
        context.close()


def test_the_course_pages_are_all_there() -> None:
    if not SITE.is_dir():
        pytest.skip("no site built")
    pages = set(_pages())
    wanted = {"index.html", "notebooks/NOTATION.html", "docs/metrics.html", "docs/cluster.html",
              "benchmarks/README.html",
              *(f"notebooks/{p.stem}.html" for p in (ROOT / "notebooks").glob("0*.ipynb"))}
    assert wanted <= pages, f"missing pages: {sorted(wanted - pages)}"


def _explorer_state(page, index: int) -> dict:
    return page.evaluate("""i => { const gd = document.querySelectorAll('.rlhf-static-explorer')[i];
        return {kind: gd.dataset.explorer, controls: JSON.parse(gd.dataset.controls),
                sliders: gd.layout.sliders.map(s => ({name: s.name, active: s.active,
                                                      values: s.steps.map(t => t.value)})),
"""
        "                data: gd.data.map(t => ({x: t.x ? Array.from(t.x) : null,"
        " y: t.y ? Array.from(t.y) : null})),\n"
        "                paths: Array.from(gd.querySelectorAll('.trace path'))"
        ".map(p => p.getAttribute('d')).join('|'),\n"
        """                title: gd._fullLayout.title.text}; }""", index)


def _click_step(page, index: int, slider: int, step: int) -> None:
    """Click the rail of `slider` above the label of `step`, as a reader does."""
    group = page.locator(".rlhf-static-explorer").nth(index).locator(".slider-group").nth(slider)
    group.scroll_into_view_if_needed()
    label = group.locator(".slider-label-group").nth(step).bounding_box()
    rail = group.locator(".slider-rail-touch-rect").bounding_box()
    page.mouse.click(label["x"] + label["width"] / 2, rail["y"] + rail["height"] / 2)


def _check_numbers(state: dict, where: str) -> None:
    params = dict(state["controls"])
    for slider in state["sliders"]:
        params[slider["name"]] = float(slider["values"][slider["active"]])
    x = state["data"][0]["x"]
    for trace, want in expected_traces(state["kind"], params, x).items():
        got = np.array(state["data"][trace]["y"], dtype=float)
        np.testing.assert_allclose(np.where(np.isnan(want), np.nan, got), want, **TOLERANCE,
                                   err_msg=f"{where}: trace {trace} at {params}")


def _move_every_slider(page, name: str, index: int) -> None:
    """Check explorer `index` as opened, then click one step of each of its sliders in turn (so the
    second click lands on a combination of both) and check that the figure changed, to the maths
    core's numbers."""
    before = _explorer_state(page, index)
    _check_numbers(before, f"{name} explorer {index} as opened")
    for s, slider in enumerate(before["sliders"]):
        step = 0 if slider["active"] != 0 else len(slider["values"]) - 1
        previous = _explorer_state(page, index)
        _click_step(page, index, s, step)
        page.wait_for_function(
            """([i, s, step]) => document.querySelectorAll('.rlhf-static-explorer')[i]
            .layout.sliders[s].active === step""", arg=[index, s, step], timeout=WAIT_MS)
        page.wait_for_timeout(100)  # the update's redraw
        after = _explorer_state(page, index)
        where = (f"{name} explorer {index} ({after['kind']}) {slider['name']} = "
                 f"{slider['values'][step]}")
        assert after["paths"] != previous["paths"], f"{where}: the figure did not change"
        assert after["title"] != previous["title"], f"{where}: the title did not change"
        _check_numbers(after, where)


def test_link_checker_finds_missing_files_and_anchors() -> None:
    if not (SITE / "index.html").is_file():
        pytest.skip("no site built")
    site = "http://127.0.0.1:1/"
    page = site + "notebooks/01_policy_gradients.html"
    hrefs = ["../index.html", "NOTATION.html", "../docs/metrics.html#kl", "https://example.org",
             "#", GITHUB, "missing.html", "../docs/metrics.html#no-such-anchor",
             "//cdn.example.org/x.js"]
    assert (broken_links(page, hrefs, site)
            == ["missing.html", "../docs/metrics.html#no-such-anchor (no such anchor)",
                                               "//cdn.example.org/x.js (outside the site)"])
