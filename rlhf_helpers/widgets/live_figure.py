"""A plotly figure shown once in a notebook and replaced in place, e.g. training curves during a
loop.

    live = LiveFigure(go.Figure(layout_title_text="waiting for step 1"))   # shown here
    for step in ...:
        live.update(plot_curves(history))                                  # same output, new figure

Why not `display(fig, display_id=True)` and `handle.update(fig)`: a plotly figure defines
`_ipython_display_`, and IPython then hands the whole display to it, which calls `pio.show` and
drops the display id. Every update appends a new figure under the cell (11 stacked figures in
notebook 05's training loop). Here the figure is turned into the mime bundle of the explorers'
"html" display backend (`rlhf_helpers.widgets.html_figure`: self-contained HTML that loads plotly.js
itself, which renders in Colab, plus plotly's JSON for JupyterLab's offline renderer), and that
bundle is displayed and updated raw, so the display id holds.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from IPython import get_ipython
from IPython.display import display

from rlhf_helpers.widgets.backends import in_colab
from rlhf_helpers.widgets.html_figure import mime_bundle


def figure_bundle(fig: go.Figure) -> dict[str, Any]:
    """The mime bundle shown for `fig`: HTML that draws it anywhere, plus plotly's JSON outside
    Colab (Colab would pick the JSON and has no renderer for it)."""
    return mime_bundle(fig, with_plotly_mime=not in_colab())


class LiveFigure:
    """One output that shows a plotly figure and is replaced by `update` (no stacked copies)."""

    def __init__(self, fig: go.Figure) -> None:
        self.updates = 0  #: how many times the figure was replaced
        self.figure = fig  #: the figure shown now
        # outside IPython (scripts, tests) there is nothing to draw into: keep the figure only
        self._handle = display(figure_bundle(fig), raw=True,
                               display_id=True) if get_ipython() else None

    def update(self, fig: go.Figure) -> None:
        """Replace the shown figure by `fig`, in the same output."""
        self.figure = fig
        self.updates += 1
        if self._handle is None:
            return
        if not in_colab():
            # plotly's JupyterLab renderer ignores new data once it has drawn a graph, but a change
            # of mime type makes JupyterLab replace the renderer: send the HTML alone, then HTML +
            # JSON, so the output ends with the JSON (drawn offline, also in the saved notebook)
            self._handle.update(mime_bundle(fig, with_plotly_mime=False), raw=True)
        self._handle.update(figure_bundle(fig), raw=True)
