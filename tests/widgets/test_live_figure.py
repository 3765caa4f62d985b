"""LiveFigure replaces its figure in place in a real kernel; plain display ids with plotly stack
copies."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import plotly.graph_objects as go
import pytest

from rlhf_helpers.course.run_course import execute_notebook
from rlhf_helpers.widgets.live_figure import LiveFigure, figure_bundle


def _titles(nb: nbformat.NotebookNode) -> list[str]:
    """The layout title of every plotly figure in the notebook's outputs, in order."""
    titles = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "application/vnd.plotly.v1+json" in data:
                titles.append(data["application/vnd.plotly.v1+json"]["layout"]["title"]["text"])
            elif "text/html" in data and "plotly" in data["text/html"]:
                titles.append(json.dumps(data["text/html"]))
    return titles


@pytest.mark.slow
def test_live_figure_keeps_one_output_and_shows_the_last_figure(tmp_path: Path):
    code = """
import plotly.graph_objects as go
import plotly.io as pio
from IPython.display import display
from rlhf_helpers.widgets.live_figure import LiveFigure
pio.renderers.default = "plotly_mimetype"  # for the plain-display comparison below
live = LiveFigure(go.Figure(layout_title_text="step 0"))
for step in (1, 2, 3):
    live.update(go.Figure(layout_title_text=f"step {step}"))
# the pattern LiveFigure replaces: plotly's _ipython_display_ drops the display id
handle = display(go.Figure(layout_title_text="plain 0"), display_id=True)
for step in (1, 2):
    handle.update(go.Figure(layout_title_text=f"plain {step}"))
"""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    path = tmp_path / "live.ipynb"
    nbformat.write(nb, path)
    titles = _titles(execute_notebook(path, timeout=120, workdir=tmp_path))
    live = [t for t in titles if t.startswith("step")]
    plain = [t for t in titles if t.startswith("plain")]
    assert live == ["step 3"], titles  # one output, replaced three times
    assert len(plain) == 3, titles  # what notebook 05 used to do: one more figure per update


def test_outside_ipython_the_figure_is_kept_and_counted():
    live = LiveFigure(go.Figure(layout_title_text="a"))
    live.update(go.Figure(layout_title_text="b"))
    assert live.updates == 1 and live.figure.layout.title.text == "b"


def test_figure_bundle_holds_the_figure_as_json_and_as_html():
    bundle = figure_bundle(go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout_title_text="t"))
    # outside Colab: JupyterLab draws it offline
    fig_json = bundle["application/vnd.plotly.v1+json"]
    assert list(fig_json["data"][0]["y"]) == [3, 4] and fig_json["layout"]["title"]["text"] == "t"
    assert '"text":"t"' in bundle["text/html"].replace(" ", "")  # the HTML carries the same figure


def test_in_colab_the_bundle_is_html_only(monkeypatch):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert set(figure_bundle(go.Figure())) == {"text/html"}
