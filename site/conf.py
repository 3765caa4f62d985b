"""Sphinx configuration of the course's static site (`make site`: tools/build_site.py stages the
pages).

Everything a page loads is served from the site itself: plotly.js from the plotly package, MathJax
3.2 from the sphinx-mathjax-offline package (copied into _static/ once the pages are written); no
CDN. The figures are fitted to the width they are drawn at by static/rlhf-figures.js, MathJax is
configured by static/rlhf-math.js (formulas stay hidden until typeset, so raw TeX never shows).
Every page's header links to the repository on GitHub (a link only: nothing is loaded from there).
"""

from __future__ import annotations

import shutil
from importlib.metadata import distribution
from pathlib import Path

import plotly

from rlhf_helpers.course.notebook import repo_url

project = "RLHF with PPO"
author = "the RLHF with PPO course"
copyright = "the course's authors, MIT licence"  # noqa: A001 (Sphinx's name)
html_title = "RLHF with PPO, from policy gradients to shared-LoRA PPO"

extensions = ["myst_nb"]
nb_execution_mode = "off"  # the notebooks come executed (make test's build/executed/)
nb_ipywidgets_js = {}  # no widget manager from a CDN: the site's copies hold no widgets
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 4  # GitHub's heading anchors: docs/metrics.md#kl, benchmarks/README.md#...
exclude_patterns = ["**.ipynb_checkpoints"]
# H2 to H4 in notebooks: kept as written
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header"]

html_theme = "sphinx_book_theme"
html_theme_options = {
    "show_toc_level": 2, "use_download_button": False, "home_page_in_toc": True,
    # the repository of the notebooks' Colab set-up cell: a GitHub button in every page's header
    "repository_url": repo_url(), "repository_branch": "main", "use_repository_button": True,
    # pydata-sphinx-theme 0.20 puts a search field in a header strip unless this is set, and the
    # book theme already has one in the sidebar: two search boxes at the top of a wide page
    "navbar_persistent": [],
}
html_copy_source = False  # no _sources/ (2.8 MB): the notebooks are in the repository
html_static_path = ["static"]
html_favicon = "static/favicon.svg"  # else the browser asks for /favicon.ico, which is not there
html_css_files = ["site.css"]
html_last_updated_fmt = None
# else pydata-sphinx-theme logs a console error ("invalid theme mode")
html_context = {"default_mode": "light"}
html_show_sourcelink = False

#: MathJax 3.2.2 from sphinx-mathjax-offline (a data folder, not an importable module), under
#: _static/mathjax/
MATHJAX = Path(str(
    distribution("sphinx-mathjax-offline").locate_file("sphinx-mathjax-offline/static/mathjax")))
#: parts of MathJax no page of this site loads (SVG output, speech rules, other bundles)
MATHJAX_SKIP = ("sre", "output/svg", "output/svg.js", "mml-svg.js", "tex-svg.js", "tex-svg-full.js",
                "tex-mml-svg.js", "tex-chtml-full-speech.js", "mml-chtml.js", "node-main.js")
mathjax_path = "mathjax/tex-chtml.js"
mathjax_options = {"defer": "defer"}
# set by static/rlhf-math.js, which also shows the formulas once typeset (a function)
mathjax3_config = None
# else MyST writes its own window.MathJax after rlhf-math.js, replacing it
myst_update_mathjax = False
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _plotly_where_needed(app, pagename, templatename, context, doctree) -> None:
    """plotly.js (4.8 MB) only on the pages that draw a figure."""
    if "rlhf-site-figure" in context.get("body",
                                         "") or "rlhf-static-explorer" in context.get("body", ""):
        app.add_js_file("plotly.min.js")
        app.add_js_file("rlhf-figures.js")


def _copy_vendored(app, exception) -> None:
    """plotly.min.js and MathJax into _static/, from the installed packages; the theme's source maps
    out."""
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    shutil.copyfile(PLOTLY_JS, static / "plotly.min.js")
    # the theme's source maps (3.5 MB): only developer tools read them
    for source_map in static.rglob("*.map"):
        source_map.unlink()
    target = static / "mathjax"
    if not (target / "tex-chtml.js").is_file():
        shutil.copytree(MATHJAX, target, dirs_exist_ok=True,
                        ignore=lambda folder, names: [n for n in names if any(
                            (Path(folder) / n).as_posix().endswith("/" + skip)
                            for skip in MATHJAX_SKIP)])


def setup(app) -> dict:
    app.add_js_file("rlhf-math.js", priority=200)  # before MathJax itself (priority 500)
    app.add_js_file("rlhf-tables.js", loading_method="defer")
    app.connect("html-page-context", _plotly_where_needed)
    app.connect("build-finished", _copy_vendored)
    return {"parallel_read_safe": True}
