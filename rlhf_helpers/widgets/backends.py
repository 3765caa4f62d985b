"""How an explorer shows its plotly figure: a live `go.FigureWidget`, or a plain `go.Figure` redrawn
into an `ipywidgets.Output`. Chosen automatically, overridable per call or by environment variable.

- "figurewidget": the figure is itself a widget; an update sends only the changed arrays
  (`fig.batch_update()` groups them into one message), so dragging a slider is smooth. Needs a
  frontend that renders plotly's FigureWidget (plotly >= 6 builds it on anywidget; JupyterLab and
  Notebook 7 do, Colab does not reliably).
- "output": every update re-displays a static figure inside an Output widget. It renders wherever
  plotly figures render (Colab included), at the price of a full redraw per update.

Precedence: the `backend=` argument ("figurewidget" | "output" | "auto") > the environment variable
RLHF_WIDGETS_BACKEND > auto-detection ("output" in Colab or when FigureWidget cannot be built,
else "figurewidget").
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import ipywidgets as widgets
import plotly.graph_objects as go
from IPython import get_ipython
from IPython.display import clear_output, display

BACKENDS = ("figurewidget", "output")  #: the two ways to show a figure
ENV_VAR = "RLHF_WIDGETS_BACKEND"  #: environment variable that overrides auto-detection


def in_colab() -> bool:
    """True inside Google Colab (whose frontend does not reliably render plotly's FigureWidget)."""
    return "google.colab" in sys.modules


def figurewidget_problem() -> str | None:
    """Why a plotly FigureWidget cannot be built here (e.g. anywidget missing), or None if it can."""
    try:
        go.FigureWidget()
    except Exception as err:  # ImportError, or a broken ipywidgets/anywidget install
        return f"{type(err).__name__}: {err}"
    return None


def _check_name(name: str, source: str) -> str:
    value = name.strip().lower()
    if value not in ("auto", *BACKENDS):
        raise ValueError(f"{source} must be one of 'auto', 'figurewidget', 'output', got {name!r}")
    return value


def resolve_backend(backend: str = "auto") -> str:
    """'auto' | 'figurewidget' | 'output' -> the backend to use ('figurewidget' or 'output')."""
    if not isinstance(backend, str):
        raise ValueError(f"backend must be 'auto', 'figurewidget' or 'output', got {backend!r}")
    choice = _check_name(backend, "backend")
    if choice == "auto":
        choice = _check_name(os.environ.get(ENV_VAR, "auto") or "auto", ENV_VAR)
    if choice != "auto":
        return choice
    if in_colab() or figurewidget_problem() is not None:
        return "output"
    return "figurewidget"


class FigureView:
    """One plotly figure inside a widget, updated the same way whatever the backend.

    `figure` holds the current data (a FigureWidget or a go.Figure: read `.data` / `.layout` in tests);
    `widget` is what to put in a layout; change the figure inside `with view.batch() as fig: ...`.
    """

    def __init__(self, figure: go.Figure, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend  #: "figurewidget" or "output"
        self.redraws = 0  #: how many times the output backend re-displayed the figure
        self._overlays: tuple[list[dict], list[dict]] | None = None  # last set_overlays arguments
        if backend == "figurewidget":
            self.figure = go.FigureWidget(figure)
            self.widget = self.figure
        else:
            self.figure = go.Figure(figure)
            self.widget = widgets.Output(layout=widgets.Layout(min_height=f"{figure.layout.height or 450}px"))
            self.redraw()

    @contextlib.contextmanager
    def batch(self) -> Iterator[go.Figure]:
        """Change several traces/layout properties, then show them at once (one message or one redraw)."""
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
        then deletes that property: traces whose y changed next to a marker whose x changed lost
        their x and were drawn against the point index. Re-sending the current value (what the
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
        """Output backend: replace the Output's content by the current figure (no flicker: wait=True)."""
        self.redraws += 1
        if get_ipython() is None:  # plain Python (scripts, tests): nothing could show it
            return
        with self.widget:
            clear_output(wait=True)
            display(self.figure)
