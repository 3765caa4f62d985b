"""KL explorer: the KL estimators of KL(pi || ref) (k1, k2, k3), as curves and from sampled tokens.

Two categorical distributions over a small vocabulary: ref is fixed, pi = softmax(ref logits +
shift * direction). Tokens are sampled from pi with a seeded torch.Generator; every estimate comes
from `kl_estimate`, and the exact KL = sum_y pi(y) k1(y) is the k1 estimator averaged exactly. The
estimators drawn are the registry's `drawn` ones (`core.kl_estimators.drawn_kl_kinds`), in its
order: one curve, one set of sampled tokens and one box each.
"""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from rlhf_helpers.core.kl import kl_estimate
from rlhf_helpers.core.kl_estimators import drawn_kl_kinds
from rlhf_helpers.widgets._base import FIGURE_FONT, FIGURE_WIDTH, Explorer
from rlhf_helpers.widgets.backends import FigureView

#: plotly's first colours, one per estimator drawn, in turn (k1 blue, k2 orange, k3 green)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def categorical_pair(shift: float, vocab: int = 8,
                     seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi, log ref over `vocab` tokens: ref fixed by `seed`, pi moved from ref by `shift` (>=
    0)."""
    gen = torch.Generator().manual_seed(seed)
    ref_logits = torch.randn(vocab, generator=gen, dtype=torch.float64)  # (V,)
    direction = torch.randn(vocab, generator=gen, dtype=torch.float64)  # (V,)
    log_ref = torch.log_softmax(ref_logits, dim=0)  # (V,)
    log_pi = torch.log_softmax(ref_logits + shift * direction, dim=0)  # (V,)
    return log_pi, log_ref


class KLExplorer(Explorer):
    """Sliders for how far pi is from ref, the number of sampled tokens per batch and the seed.

    Left: the estimators drawn (k1, k2, k3) against the log-ratio log pi(y) - log ref(y), with the
    first batch's tokens on them (k1 is negative wherever ref likes the token more than pi does).
    Right: over `repeats` batches, the spread of each estimator's batch mean against the exact
    KL(pi || ref).
    """

    def __init__(self, shift: float = 1.0, n_samples: int = 16, seed: int = 0, vocab: int = 8,
                 repeats: int = 300, backend: str = "auto") -> None:
        super().__init__(backend)
        if vocab < 2 or repeats < 2:
            raise ValueError(
                f"vocab and repeats must be >= 2, got vocab={vocab!r}, repeats={repeats!r}")
        self.vocab, self.repeats = vocab, repeats
        #: the estimators drawn: the registry's `drawn` ones when the explorer is made, in its order
        self.kinds = drawn_kl_kinds()
        self.colors = {kind: PALETTE[i % len(PALETTE)] for i, kind in enumerate(self.kinds)}
        n = len(self.kinds)
        #: trace indices: a curve per estimator, then their sampled tokens, their batch-mean boxes,
        #: and the exact KL line last
        self.curve, self.sampled, self.box, self.exact = 0, n, 2 * n, 3 * n
        self.number("shift", "π far from ref", shift, 0.0, 3.0, 0.05)
        self.number("n_samples", "tokens / batch", n_samples, 1, 256, 1, integer=True)
        self.number("seed", "seed", seed, 0, 99, 1, integer=True)
        self.log_ratio_grid = torch.linspace(-3.0, 3.0, 241, dtype=torch.float64)  # (N,)
        self.view = FigureView(self._empty_figure(), self.backend)
        self.views.append(self.view)
        self._finish(
            [*(self.controls[n].box for n in ("shift", "n_samples", "seed")), self.view.widget])

    def _empty_figure(self) -> go.Figure:
        fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.1,
                            subplot_titles=("estimators against the log-ratio",
                                            "batch means over repeated batches"))
        x, colors = self.log_ratio_grid.tolist(), self.colors
        for kind in self.kinds:
            fig.add_trace(
                go.Scatter(x=x, y=x, name=kind, line={"color": colors[kind]}, legendgroup=kind),
                row=1, col=1)
        for kind in self.kinds:
            fig.add_trace(
                go.Scatter(x=[0.0], y=[0.0], mode="markers", name=f"{kind}, sampled tokens",
                           marker={"color": colors[kind], "size": 8, "opacity": 0.6},
                           legendgroup=kind, showlegend=False), row=1, col=1)
        for kind in self.kinds:
            fig.add_trace(go.Box(y=[0.0], name=kind, marker={"color": colors[kind]}, boxmean="sd",
                                 legendgroup=kind, showlegend=False), row=1, col=2)
        fig.add_trace(
            go.Scatter(x=list(self.kinds), y=[0.0] * len(self.kinds), mode="lines",
                       name="exact KL(π‖ref)", line={"color": "black", "dash": "dash", "width": 2}),
            row=1, col=2)
        fig.update_xaxes(title_text="log π(y) − log ref(y)", row=1, col=1)
        fig.update_yaxes(title_text="per-token estimate", range=[-3.2, 5.0], row=1, col=1)
        fig.update_yaxes(title_text="batch mean of the estimate", row=1, col=2)
        fig.update_layout(height=460, width=FIGURE_WIDTH, font=FIGURE_FONT,
                          template="plotly_white", uirevision="keep",
                          margin={"l": 60, "r": 30, "t": 70, "b": 50},
                          legend={"orientation": "h", "y": -0.15})
        return fig

    def compute(self, shift: float, n_samples: int, seed: int) -> dict[str, object]:
        """Curves, one batch's sampled tokens, `repeats` batch means per estimator, and the exact
        KL."""
        if not isinstance(n_samples, int) or n_samples < 1:
            raise ValueError(f"n_samples must be an int >= 1, got {n_samples!r}")
        if not (0.0 <= shift <= 20.0):
            raise ValueError(f"shift must be in [0, 20], got {shift!r}")
        log_pi, log_ref = categorical_pair(shift, self.vocab)  # (V,) each
        grid = self.log_ratio_grid  # (N,): log pi - log ref, so ref log-prob = 0 - grid
        curves = {k: kl_estimate(grid, torch.zeros_like(grid), k) for k in self.kinds}  # (N,) each
        # exact KL(pi || ref) = E_pi[log pi - log ref] = sum_y pi(y) k1(y)
        exact = float((log_pi.exp() * kl_estimate(log_pi, log_ref, "k1")).sum())
        gen = torch.Generator().manual_seed(int(seed))
        tokens = torch.multinomial(log_pi.exp(), self.repeats * n_samples, replacement=True,
                                   generator=gen).view(self.repeats, n_samples)  # (R, n)
        lp, lr = log_pi[tokens], log_ref[tokens]  # (R, n) each
        per_token = {k: kl_estimate(lp, lr, k) for k in self.kinds}  # (R, n) each
        return {"curves": curves, "exact": exact, "log_ratio": (lp - lr)[0], "per_token": per_token,
                "batch_means": {k: t.mean(dim=1) for k, t in per_token.items()}}  # (R,) each

    def _render(self) -> str:
        v = self.values()
        r = self.compute(v["shift"], v["n_samples"], v["seed"])
        with self.view.batch() as fig:
            for i, kind in enumerate(self.kinds):
                fig.data[self.curve + i].y = r["curves"][kind].numpy()
                fig.data[self.sampled + i].x = r["log_ratio"].numpy()
                fig.data[self.sampled + i].y = r["per_token"][kind][0].numpy()
                fig.data[self.box + i].y = r["batch_means"][kind].numpy()
            fig.data[self.exact].y = [r["exact"]] * len(self.kinds)
            fig.layout.title = {"text": f"exact KL(π‖ref) = {r['exact']:.4f};  {v['n_samples']} "
                                f"tokens per batch, {self.repeats} batches", "x": 0.01}
        lines = []
        for kind in self.kinds:
            means = r["batch_means"][kind]
            lines.append(
                f"{kind}: mean {float(means.mean()):.4f} ± {float(means.std()):.4f} (sd over "
                f"batches), bias {float(means.mean()) - r['exact']:+.4f}; per-token < 0: "
                f"{float((r['per_token'][kind] < 0).double().mean()):.0%}, batch mean < 0: "
                f"{float((means < 0).double().mean()):.0%}")
        lines.append(
            "k1 = log π − log ref is negative on tokens that ref likes more; only its average is "
            "the KL. k2 and k3 are never negative; k3 stays unbiased, k2 is biased when π is far.")
        return "\n".join(lines)
