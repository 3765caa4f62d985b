"""One figure style for the whole course: a plotly template, registered and made the default.

Every static figure of the notebooks and every explorer use it, so they look alike: white
background (plotly's own default is grey), the explorers' font size, a title at the left with little
space under it, and a height that suits a notebook's output area. Width is left to the output area
(autosize); a figure that sets one keeps it at most FIGURE_WIDTH (rlhf_helpers.widgets._base).
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from rlhf_helpers.runtime.figure_template import COURSE_TEMPLATE, course_template


def use_course_figure_style() -> str:
    """Register the course template (once) and make it plotly's default; returns the default's
    name."""
    if COURSE_TEMPLATE not in pio.templates:
        pio.templates[COURSE_TEMPLATE] = course_template()
    pio.templates.default = COURSE_TEMPLATE
    return pio.templates.default


#: The narrowest width a course figure is read at on a desktop: the static site's text column, in px
#: (JupyterLab's output area is wider, ~968 px in a 1400 px window).
READ_WIDTH_PX = 784
#: Average width of one character per px of font size (plotly's default sans-serif font), for
#: fitting labels.
CHAR_WIDTH_PER_PX = 0.55


def wrap_label(text: str, max_chars: int) -> str:
    """`text` broken at spaces into lines of at most `max_chars` characters (a longer word keeps its
    own line), joined with plotly's <br>; text that already holds a <br> is left as it is."""
    if "<br>" in text or len(text) <= max_chars:
        return text
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= max_chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def _legend_px(fig: go.Figure, size: float) -> int:
    """Width a vertical legend at the right takes from the panels (0 for a horizontal or hidden
    one)."""
    names = [trace.name for trace in fig.data if trace.name and trace.showlegend is not False]
    if fig.layout.showlegend is False or fig.layout.legend.orientation == "h" or len(names) < 2:
        return 0
    return int(max(map(len, names)) * CHAR_WIDTH_PER_PX * size) + 50  # + the symbol and padding


def fit_labels(fig: go.Figure, width: int = READ_WIDTH_PX) -> go.Figure:
    """Wrap the subplot titles and x-axis titles of a figure with several panels so that each fits
    its panel when the figure is `width` px wide (less its margins and a legend at the right): side
    by side, long ones would run into their neighbours. The top margin grows by a line for each
    extra line of the tallest subplot title. Returns `fig`."""
    template = (pio.templates[COURSE_TEMPLATE].layout
                if COURSE_TEMPLATE in pio.templates else go.Layout())
    margin_l = fig.layout.margin.l if fig.layout.margin.l is not None else (template.margin.l or 80)
    margin_r = fig.layout.margin.r if fig.layout.margin.r is not None else (template.margin.r or 80)
    size = (fig.layout.font.size or template.font.size or 12)
    plot_px = width - margin_l - margin_r - _legend_px(fig, size)
    panels = []  # (domain start, domain end) of each x-axis
    for name in [key for key in fig.layout if key.startswith("xaxis")]:
        axis = fig.layout[name]
        start, end = axis.domain if axis.domain is not None else (0.0, 1.0)
        panels.append((start, end))
        if axis.title.text:
            axis.title.text = wrap_label(axis.title.text,
                                         int((end - start) * plot_px / (CHAR_WIDTH_PER_PX * size)))
    extra_lines = 0
    for note in fig.layout.annotations:
        inside = [(s, e) for s, e in panels if s <= (note.x or 0) <= e]
        if note.showarrow is not False or not inside or not note.text:
            continue
        start, end = inside[0]
        note_size = note.font.size or 16  # make_subplots writes its titles at 16 px
        note.text = wrap_label(note.text,
                               int((end - start) * plot_px / (CHAR_WIDTH_PER_PX * note_size)))
        extra_lines = max(extra_lines, note.text.count("<br>"))
    if extra_lines:
        top = fig.layout.margin.t if fig.layout.margin.t is not None else (template.margin.t or 100)
        fig.update_layout(margin={"t": top + 20 * extra_lines})
    return fig
