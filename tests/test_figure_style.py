"""One course figure style: the plotly template notebooks get from show_environment, and widths that fit."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from rlhf_helpers.compare.figures import comparison_figure
from rlhf_helpers.widgets._base import FIGURE_WIDTH
from rlhf_helpers.widgets.style import COURSE_TEMPLATE, use_course_figure_style

#: JupyterLab's output area at 1400 px with the file browser open, and Colab's, are about 940-970 px wide
MAX_WIDTH = 940


@pytest.fixture
def restore_default_template():
    before = pio.templates.default
    yield
    pio.templates.default = before


def test_the_course_template_is_white_and_becomes_the_default(restore_default_template):
    assert use_course_figure_style() == COURSE_TEMPLATE == pio.templates.default
    layout = go.Figure().layout.template.layout
    white = pio.templates["plotly_white"].layout
    assert layout.plot_bgcolor == white.plot_bgcolor and layout.paper_bgcolor == white.paper_bgcolor
    assert layout.plot_bgcolor != pio.templates["plotly"].layout.plot_bgcolor  # not plotly's grey
    assert layout.margin.t < 100 and layout.title.x < 0.1  # no large gap under a left-aligned title
    assert use_course_figure_style() == COURSE_TEMPLATE  # a second call changes nothing


def test_show_environment_applies_the_style(restore_default_template, capsys):
    from rlhf_helpers.course.notebook import show_environment

    pio.templates.default = "plotly"
    show_environment()
    assert pio.templates.default == COURSE_TEMPLATE


def test_the_comparison_figure_fits_the_output_area_with_its_three_panels():
    runs = [{"method": "ppo", "settings": {"seed": 0}, "label": "PPO", "curve": [
        {"eval_hidden_score": 0.1, "eval_kl": 0.0, "train_seconds": 0.0, "samples": 0},
        {"eval_hidden_score": 0.5, "eval_kl": 1.0, "train_seconds": 5.0, "samples": 64}]}]
    fig = comparison_figure(runs, {4: {"kl": 0.64, "hidden": 0.3}})
    assert fig.layout.width <= MAX_WIDTH and FIGURE_WIDTH <= MAX_WIDTH
    titles = [a.text for a in fig.layout.annotations if a.text.startswith("hidden score against")]
    assert len(titles) == 3  # the frontier on top, seconds and responses below
    assert {trace.xaxis for trace in fig.data} == {"x", "x2", "x3"}
