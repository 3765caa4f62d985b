"""Clip explorer: PPO's clipped objective, its two terms and its gradient against the ratio.

Every curve comes from `rlhf_helpers.clipped_surrogate` evaluated on a grid of ratios; the gradient
is its autograd derivative; a batch of real ratios (optional) is summarised by `policy_loss`.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from rlhf_helpers.core.losses import clipped_surrogate, policy_loss
from rlhf_helpers.widgets._base import FIGURE_FONT, FIGURE_WIDTH, Explorer
from rlhf_helpers.widgets.backends import FigureView

#: trace indices in the figure
UNCLIPPED, CLIPPED, OBJECTIVE, CURRENT, GRADIENT, HISTOGRAM = range(6)

#: the six cases: (sign of A, region of the ratio) -> label
CASES = {
    (1, "below"): "case 1 (A>0, ρ<1−ε): ρA, gradient A",
    (1, "inside"): "case 2 (A>0, inside the band): ρA, gradient A",
    (1, "above"): "case 3 (A>0, ρ>1+ε): clipped, gradient 0",
    (-1, "below"): "case 4 (A<0, ρ<1−ε): clipped, gradient 0",
    (-1, "inside"): "case 5 (A<0, inside the band): ρA, gradient A",
    (-1, "above"): "case 6 (A<0, ρ>1+ε): ρA, gradient A, unbounded",
}


def _as_ratio_tensor(ratios: object) -> torch.Tensor:
    """A batch of PPO ratios (tensor, array or list, any shape) -> flat float64 tensor,
    validated."""
    try:
        flat = torch.as_tensor(ratios, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"ratios must be a tensor/array of numbers, got {type(ratios).__name__}") from err
    if flat.numel() == 0:
        raise ValueError("ratios is empty: pass at least one ratio from a PPO batch")
    if not bool(torch.isfinite(flat).all()) or bool((flat <= 0).any()):
        raise ValueError("ratios must be finite and > 0 (ratio = exp(logp_new - logp_old))")
    return flat


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """Index ranges [start, end] of the maximal runs of True in a list of booleans."""
    runs, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i - 1))
            start = None
    return runs


class ClipExplorer(Explorer):
    """Sliders for eps, the advantage, the ratio and an optional dual clip; plots against the ratio
    the unclipped term ρA, the clipped term clip(ρ, 1−ε, 1+ε)A, the PPO objective (their min, from
    `clipped_surrogate`) and d objective / dρ (autograd), with the zero-gradient regions shaded and
    labelled by case. `ratios`: optional real ratios from a PPO batch, drawn as a histogram.
    """

    def __init__(
        self,
        eps: float = 0.2,
        advantage: float = 1.0,
        ratio: float = 1.3,
        dual_clip: float | None = None,
        ratios: object = None,
        ratio_range: tuple[float, float] = (0.0, 3.0),
        points: int = 601,
        backend: str = "auto",
    ) -> None:
        super().__init__(backend)
        lo, hi = ratio_range
        if not (0.0 <= lo < 1.0 < hi):
            raise ValueError(f"ratio_range must satisfy 0 <= low < 1 < high, got {ratio_range!r}")
        if points < 3:
            raise ValueError(f"points must be >= 3, got {points!r}")
        self.grid = torch.linspace(lo, hi, points, dtype=torch.float64)  # (N,) ratios
        self.batch_ratios = None if ratios is None else _as_ratio_tensor(ratios)  # (M,) or None

        self.number("eps", "clip ε", eps, 0.01, 0.5, 0.01)  # ε = 0 is refused: an empty band
        self.number("advantage", "advantage A", advantage, -2.0, 2.0, 0.05)
        self.number("ratio", "ratio ρ", ratio, lo, hi, 0.01)
        self.dual_toggle = widgets.Checkbox(value=dual_clip is not None, description="dual clip",
                                            indent=False, layout=widgets.Layout(width="100px"))
        self.dual_toggle.add_class("rlhf-dual-toggle")
        self.controls["dual"] = self.dual_toggle
        # default c = 2 (the dual-clip paper has 3): its flat region shows on the default ratio axis
        c_dual = 2.0 if dual_clip is None else dual_clip
        self.number("dual_clip", "dual clip c_dual", c_dual, 1.1, 5.0, 0.1)  # > 1

        self.view = FigureView(self._empty_figure(), self.backend)
        self.views.append(self.view)
        left = widgets.VBox([self.controls[n].box for n in ("eps", "advantage", "ratio")])
        right = widgets.VBox([self.dual_toggle, self.controls["dual_clip"].box])
        self._finish([widgets.HBox([left, right]), self.view.widget])

    def _empty_figure(self) -> go.Figure:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.62, 0.38],
                            vertical_spacing=0.07, specs=[[{"secondary_y": True}], [{}]])
        x = self.grid.tolist()
        zeros = [0.0] * len(x)  # placeholders: the first update fills every curve
        for name, line in [("unclipped ρA", {"dash": "dash", "color": "#1f77b4"}),
                           ("clipped clip(ρ)A", {"dash": "dot", "color": "#ff7f0e"}),
                           ("PPO objective (min)", {"width": 4, "color": "#2ca02c"})]:
            fig.add_trace(go.Scatter(x=x, y=zeros, name=name, line=line), row=1, col=1)
        fig.add_trace(go.Scatter(x=[1.0], y=[0.0], name="current ρ", mode="markers",
                                 marker={"size": 12, "color": "black",
                                         "symbol": "x"}), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=zeros, name="d objective / dρ", line={"color": "#d62728"}),
                      row=2, col=1)
        batch = [] if self.batch_ratios is None else self.batch_ratios.tolist()
        # purple, not grey: grey bars would vanish on the grey zero-gradient shading
        fig.add_trace(
            go.Histogram(x=batch, name="your batch's ratios", histnorm="percent", opacity=0.45,
                         marker={"color": "#9467bd"}, visible=self.batch_ratios is not None,
                         xbins={"start": float(self.grid[0]), "end": float(self.grid[-1]),
                                "size": 0.02}),
            row=1, col=1, secondary_y=True)
        fig.update_layout(height=560, width=FIGURE_WIDTH, font=FIGURE_FONT,
                          # t: room for the two-line case labels between the title and the plot
                          margin={"l": 60, "r": 60, "t": 82, "b": 50}, uirevision="keep",
                          legend={"orientation": "h", "y": -0.12}, template="plotly_white")
        fig.update_yaxes(title_text="objective (maximise)", row=1, col=1, secondary_y=False)
        fig.update_yaxes(title_text="% of batch", row=1, col=1, secondary_y=True, showgrid=False,
                         visible=self.batch_ratios is not None, rangemode="tozero",
                         tickformat=".0f", tickmode="auto",
                         nticks=5)  # whole percents, not ticks synced to the left axis
        fig.update_yaxes(title_text="d objective / dρ", row=2, col=1)
        fig.update_xaxes(title_text="ratio ρ = π_θ / π_old", row=2, col=1)
        return fig

    def compute(self, eps: float, advantage: float,
                dual_clip: float | None) -> dict[str, torch.Tensor]:
        """Curves on the ratio grid, all from `clipped_surrogate`: (N,) tensors keyed by trace name.

        unclipped term = objective with the clip switched off (a band wider than the grid);
        clipped term = objective at ratios clamped to the band (where clamping changes nothing the
        two terms coincide); gradient = d objective / d ratio by autograd.
        """
        grid = self.grid.clone().requires_grad_(True)  # (N,)
        adv = torch.full_like(grid, advantage)  # (N,)
        objective = clipped_surrogate(grid, adv, eps, dual_clip)  # (N,)
        (gradient,) = torch.autograd.grad(objective.sum(), grid)  # (N,): elementwise derivative
        wide = float(self.grid[-1]) + 1.0  # a band containing the whole grid: no clipping
        unclipped = clipped_surrogate(self.grid, adv.detach(), wide)  # (N,) = ρA
        clamped = self.grid.clamp(1.0 - eps, 1.0 + eps)  # (N,): clip(ρ, 1-ε, 1+ε)
        clipped = clipped_surrogate(clamped, adv.detach(), wide)  # (N,) = clip(ρ)A
        return {"unclipped": unclipped, "clipped": clipped, "objective": objective.detach(),
                "gradient": gradient}

    def _case(self, ratio: float, eps: float, advantage: float) -> str:
        region = "below" if ratio < 1 - eps else "above" if ratio > 1 + eps else "inside"
        return CASES[(1 if advantage > 0 else -1, region)]

    def _render(self) -> str:
        v = self.values()
        eps, adv, ratio = v["eps"], v["advantage"], v["ratio"]
        dual = v["dual_clip"] if v["dual"] else None
        if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0):
            raise ValueError(f"ratio must be a finite number > 0, got {ratio!r}")
        curves = self.compute(eps, adv, dual)
        point = clipped_surrogate(torch.tensor([ratio], dtype=torch.float64),
                                  torch.tensor([adv], dtype=torch.float64), eps, dual)  # (1,)
        batch_stats = None
        if self.batch_ratios is not None:  # every token of the batch given this advantage
            logp_new = torch.log(self.batch_ratios)[None, :]  # (1, M); old log-probs are 0
            _, batch_stats = policy_loss(logp_new, torch.zeros_like(logp_new),
                                         torch.full_like(logp_new, adv),
                                         torch.ones_like(logp_new), eps, dual)
        zero = (curves["gradient"] == 0).tolist()
        x = self.grid.tolist()
        with self.view.batch() as fig:
            fig.data[UNCLIPPED].y = curves["unclipped"].numpy()
            fig.data[CLIPPED].y = curves["clipped"].numpy()
            fig.data[OBJECTIVE].y = curves["objective"].numpy()
            fig.data[GRADIENT].y = curves["gradient"].numpy()
            fig.data[CURRENT].x = [ratio]
            fig.data[CURRENT].y = point.numpy()
            self.view.set_overlays(*self._regions(x, zero, eps, adv, dual))
            fig.layout.title = {"text": f"PPO clip: ε = {eps:g}, A = {adv:+g}"
                                + (f", dual clip c_dual = {dual:g}" if dual else ""), "x": 0.01}

        if adv == 0:
            message = "A = 0: every ratio gives objective 0 and gradient 0 (no learning signal)."
        else:
            case = self._case(ratio, eps, adv)
            if dual is not None and adv < 0 and ratio > dual:
                case = "dual clip (A<0, ρ>c_dual): objective c_dual·A, gradient 0"
            message = f"ρ = {ratio:g}: {case}; objective {float(point[0]):+.3f}."
        if batch_stats is not None:
            message += (f"\nYour batch ({self.batch_ratios.numel()} ratios) with this A: "
                        f"clipfrac {float(batch_stats['clipfrac']):.1%} of tokens get no gradient; "
                        f"approx_kl {float(batch_stats['approx_kl']):.4f}.")
        return message

    def _regions(self, x: list[float], zero: list[bool], eps: float, adv: float,
                 dual: float | None) -> tuple[list[dict], list[dict]]:
        """Shaded band [1-ε, 1+ε], grey zero-gradient runs, and a case label over each region."""
        shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": 1 - eps, "x1": 1 + eps,
                   "y0": 0, "y1": 1, "fillcolor": "rgba(31,119,180,0.08)", "line": {"width": 0},
                   "layer": "below"}]
        annotations = []
        lo, hi = x[0], x[-1]
        if adv != 0:
            for region, (a, b) in {"below": (lo, 1 - eps), "inside": (1 - eps, 1 + eps),
                                   "above": (1 + eps, hi)}.items():
                label = CASES[(1 if adv > 0 else -1, region)].split(":")[0]
                annotations.append({"x": (max(a, lo) + min(b, hi)) / 2, "y": 1.0, "xref": "x",
                                    "yref": "paper", "yanchor": "bottom", "showarrow": False,
                                    "text": label.replace(" (", "<br>("), "font": {"size": 12}})
        for start, end in _runs(zero):
            x0, x1 = x[start], x[end]
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": x0, "x1": x1,
                           "y0": 0, "y1": 1, "fillcolor": "rgba(120,120,120,0.18)",
                           "line": {"width": 0}, "layer": "below"})
            dual_run = dual is not None and adv < 0 and x0 >= dual - 1e-9
            annotations.append({"x": (x0 + x1) / 2, "y": 0.2, "xref": "x", "yref": "paper",
                                "showarrow": False, "font": {"size": 13, "color": "#444"},
                                "text": "dual clip: gradient 0" if dual_run else "gradient 0"})
        return shapes, annotations
