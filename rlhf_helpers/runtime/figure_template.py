"""The course's plotly template, in the lowest layer that both its users may import: `widgets.style`
makes it plotly's default in the notebooks, and the training command's curves.html
(`stages.curves_page`) sets it on its own figure, leaving plotly's default to whoever imported the
package.

    fig.update_layout(template=course_template())

White background (plotly's own default is grey), the explorers' font size, a title at the left with
little space under it, and a height that suits a notebook's output area; the width is left to the
page (autosize).
"""

from __future__ import annotations

from typing import Any

#: Name of the course's template in plotly.io.templates.
COURSE_TEMPLATE = "rlhf_course"
#: Base font of the course's figures (plotly's default 12 is small next to the explorers' sliders).
FIGURE_FONT = {"size": 13}


def course_template() -> Any:
    """A new `plotly.graph_objects.layout.Template`: plotly_white with the course's font, title,
    margins and height."""
    # plotly: imported only when a figure is drawn
    import plotly.graph_objects as go
    import plotly.io as pio  # plotly: as above

    template = go.layout.Template(pio.templates["plotly_white"])
    template.layout.update(
        font=FIGURE_FONT,
        height=440,
        autosize=True,
        title={"x": 0.02, "xanchor": "left", "y": 0.97, "yanchor": "top"},
        margin={"l": 60, "r": 24, "t": 64, "b": 56},  # plotly's t=100 leaves a gap under the title
        legend={"bgcolor": "rgba(255,255,255,0.6)"},
    )
    return template
