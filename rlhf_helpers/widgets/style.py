"""One figure style for the whole course: a plotly template, registered and made the default.

Every static figure of the notebooks and every explorer use it, so they look alike: white
background (plotly's own default is grey), the explorers' font size, a title at the left with little
space under it, and a height that suits a notebook's output area. Width is left to the output area
(autosize); a figure that sets one keeps it at most FIGURE_WIDTH (rlhf_helpers.widgets._base).
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from rlhf_helpers.widgets._base import FIGURE_FONT

#: Name of the course's template in plotly.io.templates.
COURSE_TEMPLATE = "rlhf_course"


def use_course_figure_style() -> str:
    """Register the course template (once) and make it plotly's default; returns the default's name."""
    if COURSE_TEMPLATE not in pio.templates:
        template = go.layout.Template(pio.templates["plotly_white"])
        template.layout.update(
            font=FIGURE_FONT, height=440, autosize=True,
            title={"x": 0.02, "xanchor": "left", "y": 0.97, "yanchor": "top"},
            margin={"l": 60, "r": 24, "t": 64, "b": 56},  # plotly's t=100 leaves a gap under the title
            legend={"bgcolor": "rgba(255,255,255,0.6)"},
        )
        pio.templates[COURSE_TEMPLATE] = template
    pio.templates.default = COURSE_TEMPLATE
    return pio.templates.default
