"""One course figure style: the plotly template notebooks get from show_environment, and widths that
fit."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from rlhf_helpers.compare.figures import comparison_figure
from rlhf_helpers.widgets._base import FIGURE_WIDTH
from rlhf_helpers.widgets.style import COURSE_TEMPLATE, use_course_figure_style

#: JupyterLab's output area at 1400 px with the file browser open, and Colab's, are about 940-970 px
#: wide
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


def test_wrap_label_breaks_at_spaces_within_the_limit():
    from rlhf_helpers.widgets.style import wrap_label

    wrapped = wrap_label("ratio mean, first minibatch of each step", 20)
    assert wrapped == "ratio mean, first<br>minibatch of each<br>step"
    assert wrap_label("short", 20) == "short"
    # already broken by hand: kept
    assert wrap_label("a<br>b c d e f g h", 3) == "a<br>b c d e f g h"
    # a long word keeps a line
    assert wrap_label("supercalifragilistic word", 5) == "supercalifragilistic<br>word"


def test_fit_labels_wraps_to_each_panel_and_makes_room_above(restore_default_template):
    """Three panels in the 784 px column, course template (margins 60 + 24, font 13; subplot titles
    16 px): make_subplots spaces three columns by 0.2 / 3, so each panel spans (1 - 2 * 0.2 / 3) /
    3 = 0.289 of 784 - 84 px, 202 px. A title of 16 px letters (0.55 * 16 = 8.8 px each) keeps at
    most 22 characters a line, an axis title of 13 px letters (7.15 px) at most 28; a vertical
    legend narrows both."""
    from plotly.subplots import make_subplots

    from rlhf_helpers.widgets.style import fit_labels

    use_course_figure_style()
    long_title = "ratio mean, first minibatch of each step"
    fig = make_subplots(rows=1, cols=3,
                        subplot_titles=(long_title, "clip", "approx-KL of the update"))
    fig.update_xaxes(title_text="PPO step after the baseline, counted from one")
    fit_labels(fig)
    for note in fig.layout.annotations:
        assert max(len(line) for line in note.text.split("<br>")) <= 22, note.text
    assert fig.layout.annotations[1].text == "clip"
    assert all(max(map(len, fig.layout[f"xaxis{i}"].title.text.split("<br>"))) <= 28
               for i in ("", "2", "3"))
    # two lines: one more
    assert fig.layout.margin.t == pio.templates[COURSE_TEMPLATE].layout.margin.t + 20
    with_legend = make_subplots(rows=1, cols=3, subplot_titles=(long_title, "b", "c"))
    for name in ("broken: reference log-probs as old", "fixed"):
        with_legend.add_scatter(x=[0], y=[0], name=name, row=1, col=1)
    fit_labels(with_legend)
    assert (with_legend.layout.annotations[0].text.count("<br>")
            > fig.layout.annotations[0].text.count("<br>"))
