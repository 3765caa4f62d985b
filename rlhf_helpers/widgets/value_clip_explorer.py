"""Value-clip explorer: the critic's loss, clipped and unclipped, as a function of the new value.

Each point of a curve is `value_loss` for one token (B = T = 1) at that new value, evaluated over
the grid with `torch.func.vmap`; the gradient is `torch.func.grad` of the same call.
"""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from rlhf_helpers.core.checks import validation
from rlhf_helpers.core.losses import value_loss
from rlhf_helpers.widgets._base import FIGURE_FONT, FIGURE_WIDTH, Explorer
from rlhf_helpers.widgets.backends import FigureView
from rlhf_helpers.widgets.clip_explorer import _runs

#: trace indices in the figure
UNCLIPPED, CLIPPED, CURRENT, GRAD_UNCLIPPED, GRAD_CLIPPED = range(5)


class ValueClipExplorer(Explorer):
    """Sliders for value_clip ε_V, the old value V_old, the return G = G^λ (the critic's target) and
    the new value V; plots 0.5 (V − G)² and the clipped 0.5 max((V − G)², (V_old + clip(V − V_old,
    −ε_V, ε_V) − G)²) against V, and their gradients, shading where clipping removes the gradient.
    """

    def __init__(self, value_clip: float = 0.2, old_value: float = 0.0, ret: float = 1.0,
                 value: float = 0.5, value_range: tuple[float, float] = (-2.0, 3.0),
                 points: int = 501, backend: str = "auto") -> None:
        super().__init__(backend)
        lo, hi = value_range
        if not lo < hi or points < 3:
            raise ValueError(f"value_range must be (low, high) with low < high and points >= 3, "
                             f"got {value_range!r}, {points!r}")
        self.grid = torch.linspace(lo, hi, points, dtype=torch.float64)  # (N,) new values
        self.number("value_clip", "clip range ε_V", value_clip, 0.01, 1.0, 0.01)  # > 0
        self.number("old_value", "old value V_old", old_value, lo, hi, 0.05)
        self.number("ret", "return G^λ", ret, lo, hi, 0.05)
        self.number("value", "new value V", value, lo, hi, 0.01)
        self.view = FigureView(self._empty_figure(), self.backend)
        self.views.append(self.view)
        self._finish([*(self.controls[n].box for n in ("value_clip", "old_value", "ret", "value")),
                      self.view.widget])

    def _empty_figure(self) -> go.Figure:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.6, 0.4],
                            vertical_spacing=0.07)
        x = self.grid.tolist()
        fig.add_trace(
            go.Scatter(x=x, y=x, name="unclipped ½(V − G^λ)²", line={"dash": "dash"}), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=x, name="clipped loss", line={"width": 4}), row=1, col=1)
        fig.add_trace(go.Scatter(x=[0.0], y=[0.0], mode="markers", name="current V",
                                 marker={"size": 12, "color": "black",
                                         "symbol": "x"}), row=1, col=1)
        fig.add_trace(
            go.Scatter(x=x, y=x, name="d unclipped / dV", line={"dash": "dash"}), row=2, col=1)
        fig.add_trace(go.Scatter(x=x, y=x, name="d clipped / dV", line={"width": 3}), row=2, col=1)
        fig.update_xaxes(title_text="new value V", row=2, col=1)
        fig.update_yaxes(title_text="loss (minimise)", row=1, col=1)
        fig.update_yaxes(title_text="gradient", row=2, col=1)
        fig.update_layout(height=540, width=FIGURE_WIDTH, font=FIGURE_FONT,
                          template="plotly_white", uirevision="keep",
                          margin={"l": 60, "r": 30, "t": 60, "b": 50},
                          legend={"orientation": "h", "y": -0.14})
        return fig

    def compute(self, value_clip: float | None, old_value: float,
                ret: float) -> dict[str, torch.Tensor]:
        """Loss and d loss / dV on the grid for one token: (N,) tensors, from `value_loss`."""
        one = torch.ones(1, 1, dtype=torch.float64)  # (1, 1) mask
        old = torch.full((1, 1), float(old_value), dtype=torch.float64)  # (1, 1)
        target = torch.full((1, 1), float(ret), dtype=torch.float64)  # (1, 1)
        # validates the inputs, with the value checks on
        value_loss(old, old, target, one, value_clip)

        def loss_at(v: torch.Tensor) -> torch.Tensor:
            return value_loss(v.reshape(1, 1), old, target, one, value_clip)[0]

        # vmap cannot run the data-dependent checks (NaN, 0/1 mask); they passed just above
        with validation(False):
            loss = torch.func.vmap(loss_at)(self.grid)  # (N,)
            gradient = torch.func.vmap(torch.func.grad(loss_at))(self.grid)  # (N,)
        return {"loss": loss, "gradient": gradient}

    def _render(self) -> str:
        v = self.values()
        c, old, ret, value = v["value_clip"], v["old_value"], v["ret"], v["value"]
        clipped = self.compute(c, old, ret)
        unclipped = self.compute(None, old, ret)
        m = torch.ones(1, 1, dtype=torch.float64)
        point_loss, point_stats = value_loss(torch.full((1, 1), float(value), dtype=torch.float64),
                                             torch.full((1, 1), float(old), dtype=torch.float64),
                                             torch.full((1, 1), float(ret),
                                                        dtype=torch.float64), m, c)
        x = self.grid.tolist()
        zero = ((clipped["gradient"] == 0) & (unclipped["gradient"] != 0)).tolist()
        shapes = [
            {"type": "rect", "xref": "x", "yref": "paper", "x0": old - c, "x1": old + c, "y0": 0,
             "y1": 1, "fillcolor": "rgba(31,119,180,0.08)", "line": {"width": 0}, "layer": "below"}]
        annotations = [{"x": old, "y": 1.0, "xref": "x", "yref": "paper", "yanchor": "bottom",
                        "showarrow": False, "text": "V_old ± ε_V"},
                       # under the "clipped" label at the panel's top, so neither crosses the other
                       {"x": ret, "y": 0.8, "xref": "x", "yref": "paper", "showarrow": True,
                        "ay": -22, "text": "G^λ"}]
        for start, end in _runs(zero):
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": x[start],
                           "x1": x[end], "y0": 0, "y1": 1, "fillcolor": "rgba(120,120,120,0.18)",
                           "line": {"width": 0}, "layer": "below"})
            # top of the loss panel, white label: lower (y = 0.2) it would sit on the gradient lines
            annotations.append(
                {"x": (x[start] + x[end]) / 2, "y": 0.98, "xref": "x", "yref": "paper",
                 "yanchor": "top", "showarrow": False, "text": "clipped: gradient 0",
                 "font": {"size": 11}, "bgcolor": "rgba(255,255,255,0.85)"})
        with self.view.batch() as fig:
            fig.data[UNCLIPPED].y = unclipped["loss"].numpy()
            fig.data[CLIPPED].y = clipped["loss"].numpy()
            fig.data[GRAD_UNCLIPPED].y = unclipped["gradient"].numpy()
            fig.data[GRAD_CLIPPED].y = clipped["gradient"].numpy()
            fig.data[CURRENT].x = [value]
            fig.data[CURRENT].y = [float(point_loss)]
            self.view.set_overlays(shapes, annotations)
            fig.layout.title = {
                "text": f"value clip: ε_V = {c:g}, V_old = {old:g}, G^λ = {ret:g}", "x": 0.01}
        branch = (
            "the clipped error is larger: no gradient, V may not move further from V_old this step"
            if float(point_stats["vf_clipfrac"]) > 0
            else "the unclipped error is used: gradient V − G^λ")
        return f"V = {value:g}: loss {float(point_loss):.4f}; {branch}."
