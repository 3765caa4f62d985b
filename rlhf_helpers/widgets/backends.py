"""How an explorer shows its plotly figure, chosen automatically, overridable per call or by
environment variable. Three backends:

- "figurewidget": the figure is itself a widget (`go.FigureWidget`); an update sends only the
  changed arrays (`fig.batch_update()` groups them into one message), so dragging a slider is
  smooth. Needs a frontend that renders plotly's FigureWidget: JupyterLab and Notebook 7 do
  (plotly >= 6 builds it on anywidget), offline. Each one carries plotly.js (~4.6 MB) in its
  widget state, so executed notebooks that store widget state grow by that much per figure.
- "html": the controls stay an ipywidgets box; the figure is a cell-level output below it, a mime
  bundle of self-contained HTML (its own script loads plotly.js once per page, then draws) and,
  outside Colab, plotly's JSON mime type (`html_figure`). Each update (slider released) replaces
  that output in place through its display id (`update_display`), never stacking a new figure.
  No plotly renderer or custom widget is involved, so it works where those do not (Colab).
- "output": every update re-displays a plain `go.Figure` inside an `ipywidgets.Output`. Kept for
  comparison (tests/widgets/test_widgets_browser.py shows it failing); it renders only where the
  frontend has a plotly renderer that works inside an Output widget (JupyterLab with plotly's
  extension).

Why "html" in Colab, from the three candidates:

- A plotly figure in an `ipywidgets.Output` renders nothing in Colab: "Uncaught ReferenceError:
  Plotly is not defined" (googlecolab/colabtools#5889, open since 2026-03; also #1458, #1355).
  Colab's default plotly renderer ("colab") emits `<script src=cdn.plot.ly/...>` next to an inline
  `Plotly.newPlot`; a frontend that inserts that HTML into the page runs the inline script before
  the src has loaded (reproduced in tests/widgets/test_widgets_browser.py, with that same error).
- FigureWidget is unreliable there: Colab renders third-party widgets only through its custom
  widget manager (colabtools#498), and plotly's widget still fails in it
  (colab-cdn-widget-manager#51, open since 2024-03, re-opening #19; plotly.py#2202).
- Displaying the figure itself with a display id does not update in place: plotly's Figure has
  `_ipython_display_`, which ignores display_id, so `handle.update(fig)` adds a new figure instead
  of replacing it (colabtools#2020, "update_display() renders a new display instead of updating an
  existing one"; Colab's maintainer traced it to plotly's display data carrying no display_id, and
  the reporter's fix, `display(HTML(fig.to_html()), display_id=...)`, updates in place). Hence the
  bundle is built here and sent with `display(bundle, raw=True, display_id=...)` and
  `update_display(bundle, raw=True, display_id=...)`.
- Cell-level HTML that loads plotly.js from plotly's CDN is what plotly's own "colab" renderer does
  (plotly.io renderers, chosen by default in Colab), and plotly figures shown at cell level render
  in Colab (plotly.py#5314: the same output renders in Colab, not in nbviewer). Our script waits
  for plotly.js before drawing, so it does not depend on how the frontend runs scripts.
- Not checked in Colab itself (no Colab from CI): tests/widgets/test_widgets_browser.py reproduces
  #5889 with the "output" backend and checks "html" in a JupyterLab without plotly's renderer
  extension, where slider moves reach the figure the same way (update_display_data sent from a
  widget callback).
- A static image (PNG/SVG) needs kaleido, which is not a dependency of the course and drives a
  headless Chrome to export each image, and it loses hover and zoom.

Without internet (JupyterLab offline, saved notebooks, whose HTML scripts do not run until
trusted): the first display also carries plotly's JSON mime type, which plotly's JupyterLab
extension draws offline with its own plotly.js (and then leaves on the page as `window.Plotly`,
which the HTML of later updates uses: no CDN needed there either). So headless runs (`run_course`,
the notebook tests) use "html": the saved notebook holds a few tens of kB per figure and no
plotly.js, and shows every figure in JupyterLab without internet. Live, "figurewidget" stays the
default outside Colab (it needs no CDN).

Precedence: the `backend=` argument ("figurewidget" | "html" | "output" | "auto") > the environment
variable RLHF_WIDGETS_BACKEND > auto-detection ("html" in Colab or when FigureWidget cannot be
built, else "figurewidget").
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator

import ipywidgets as widgets
import plotly.graph_objects as go
from IPython import get_ipython
from IPython.display import clear_output, display, update_display

from rlhf_helpers.widgets.html_figure import mime_bundle

BACKENDS = ("figurewidget", "html", "output")  #: the ways to show a figure
ENV_VAR = "RLHF_WIDGETS_BACKEND"  #: environment variable that overrides auto-detection


def in_colab() -> bool:
    """True inside Google Colab (where neither FigureWidget nor a figure in an Output renders)."""
    return "google.colab" in sys.modules


def figurewidget_problem() -> str | None:
    """Why a plotly FigureWidget cannot be built here (e.g. anywidget missing), or None if it
    can."""
    try:
        go.FigureWidget()
    except Exception as err:  # ImportError, or a broken ipywidgets/anywidget install
        return f"{type(err).__name__}: {err}"
    return None


def _check_name(name: str, source: str) -> str:
    value = name.strip().lower()
    if value not in ("auto", *BACKENDS):
        raise ValueError(
            f"{source} must be one of 'auto', {', '.join(map(repr, BACKENDS))}, got {name!r}")
    return value


def resolve_backend(backend: str = "auto") -> str:
    """'auto' | 'figurewidget' | 'html' | 'output' -> the backend to use (one of BACKENDS)."""
    if not isinstance(backend, str):
        raise ValueError(
            f"backend must be 'auto', 'figurewidget', 'html' or 'output', got {backend!r}")
    choice = _check_name(backend, "backend")
    if choice == "auto":
        choice = _check_name(os.environ.get(ENV_VAR, "auto") or "auto", ENV_VAR)
    if choice != "auto":
        return choice
    if in_colab() or figurewidget_problem() is not None:
        return "html"
    return "figurewidget"


class FigureView:
    """One plotly figure, updated the same way whatever the backend.

    `figure` holds the current data (a FigureWidget or a go.Figure: read `.data` / `.layout` in
    tests); `widget` is what to put in the explorer's layout (None for "html": that figure is a
    cell-level output, shown by `show()` below the controls); change the figure inside
    `with view.batch() as fig:`.
    """

    def __init__(self, figure: go.Figure, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend  #: "figurewidget", "html" or "output"
        self.redraws = 0  #: how many times the "html"/"output" backend re-rendered the figure
        #: "html": the id of the cell output that holds the figure
        self.display_id: str | None = None
        self.shown = False  #: "html": True once `show()` has displayed the figure
        #: "html": add plotly's JSON mime type to the first display (not in Colab, which has no
        #: renderer for it: there the HTML alone is sent)
        self.with_plotly_mime = backend == "html" and not in_colab()
        self._overlays: tuple[list[dict], list[dict]] | None = None  # last set_overlays arguments
        if backend == "figurewidget":
            self.figure = go.FigureWidget(figure)
            self.widget = self.figure
        elif backend == "html":
            self.figure = go.Figure(figure)
            self.widget = None
            self.display_id = f"rlhf-figure-{uuid.uuid4().hex}"
        else:
            self.figure = go.Figure(figure)
            self.widget = widgets.Output(
                layout=widgets.Layout(min_height=f"{figure.layout.height or 450}px"))
            self.redraw()

    def mime_bundle(self, first: bool = True) -> dict[str, object]:
        """For "html": the current figure as a raw mime bundle: self-contained HTML, plus plotly's
        JSON in the first display outside Colab. Updates carry the HTML alone: plotly's JupyterLab
        renderer ignores new data once it has drawn (its renderModel returns early when a graph
        exists), whereas a change of mime type makes JupyterLab replace the renderer."""
        return mime_bundle(self.figure, with_plotly_mime=first and self.with_plotly_mime)

    def show(self) -> None:
        """For "html": display the figure as a cell-level output with this view's display id (the
        other backends are inside the explorer's widget, so there is nothing to do)."""
        if self.backend != "html":
            return
        # the same id again (the explorer shown in two cells) gives two outputs, both kept updated
        display(self.mime_bundle(), raw=True, display_id=self.display_id)
        self.shown = True

    @contextlib.contextmanager
    def batch(self) -> Iterator[go.Figure]:
        """Change several traces/layout properties, then show them at once (one message or one
        redraw)."""
        if self.backend == "figurewidget":
            with self.figure.batch_update():
                yield self.figure
                self._fill_batch_gaps()
        else:
            yield self.figure
            self.redraw()

    def set_overlays(self, shapes: list[dict], annotations: list[dict]) -> None:
        """Set the layout's shapes and annotations, skipped when they equal the last ones set:
        plotly validates every shape and annotation on assignment, the slowest part of an update,
        and most slider moves (the ratio, the size of A) leave the shaded regions as they were."""
        if (shapes, annotations) == self._overlays:
            return
        self.figure.layout.shapes, self.figure.layout.annotations = shapes, annotations
        self._overlays = (shapes, annotations)

    def _fill_batch_gaps(self) -> None:
        """Give every trace edited in this batch every property edited in it.

        `batch_update` sends one Plotly.update with, per property, one value per edited trace, and
        "undefined" for the traces that did not set it. plotly.js (FigureWidget, plotly 6 and 7)
        then deletes that property: a trace whose y changes next to a marker whose x changes loses
        its x and is drawn against the point index. Re-sending the current value (what the
        Python figure holds anyway) keeps the message free of "undefined".
        """
        edits = getattr(self.figure, "_batch_trace_edits", None)  # {trace index: {prop: value}}
        if not edits:
            return
        props = set().union(*(style.keys() for style in edits.values()))
        for index, style in edits.items():
            for prop in props - style.keys():
                style[prop] = self.figure.data[index][prop]

    def redraw(self) -> None:
        """For "output": replace the Output's content by the current figure (no flicker: wait=True);
        "html": replace the cell output with that display id by the current figure."""
        self.redraws += 1
        if get_ipython() is None:  # plain Python (scripts, tests): nothing could show it
            return
        if self.backend == "html":
            if self.shown:  # before `show()` there is no output to replace: show() sends the state
                update_display(self.mime_bundle(first=False), raw=True, display_id=self.display_id)
            return
        with self.widget:
            clear_output(wait=True)
            display(self.figure)
