"""Advantage (GAE) explorer: one response token by token, from KL-shaped rewards to whitened
advantages.

Numbers come from `shape_rewards`, `td_errors`, `compute_gae` and `masked_whiten`; the Monte-Carlo
return shown for comparison is `compute_gae` with V = 0 and lambda = 1 (then A_t = sum_l gamma^l
r_{t+l}).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from rlhf_helpers.core.gae import compute_gae, td_errors
from rlhf_helpers.core.kl import shape_rewards
from rlhf_helpers.core.kl_estimators import drawn_kl_kinds
from rlhf_helpers.core.masked import masked_whiten
from rlhf_helpers.widgets._base import DESCRIPTION_STYLE, FIGURE_FONT, FIGURE_WIDTH, Explorer
from rlhf_helpers.widgets.backends import FigureView

#: trace indices in the figure
KL_PART, SCORE_PART, REWARD, TD, ADVANTAGE, WHITENED, RETURN, MC_RETURN, VALUE = range(9)


@dataclass
class TokenResponse:
    """One sampled response as PPO sees it, token by token (all lists of the same length T >= 2)."""

    tokens: list[str] = field(default_factory=lambda: [
        "The", " soup", " was", " fresh", " and", " the", " staff", " were", " kind", "."])
    """the response's tokens, as text (for the axis labels)"""
    logprobs: list[float] = field(default_factory=lambda: [
        -1.2, -2.0, -0.4, -2.6, -0.9, -1.1, -1.8, -0.7, -2.2, -0.3])
    """log pi(y_t): log-prob of each token under the policy that sampled it"""
    ref_logprobs: list[float] = field(default_factory=lambda: [
        -1.3, -2.4, -0.5, -3.9, -0.8, -1.2, -2.0, -0.6, -3.4, -0.3])
    """log ref(y_t): the same tokens under the frozen reference model"""
    values: list[float] = field(default_factory=lambda: [
        0.2, 0.3, 0.35, 0.6, 0.7, 0.75, 0.9, 1.0, 1.3, 1.4])
    """V(s_t): the critic's value before each token"""
    score: float = 1.6
    """the reward model's score of the whole response (placed on the last token)"""

    def tensors(self) -> dict[str, torch.Tensor]:
        """Validated (1, T) float64 tensors logprobs, ref_logprobs, values, mask and score (1,)."""
        T = len(self.tokens)
        if T < 2:
            raise ValueError(f"tokens must hold at least 2 tokens (whitening needs 2), got {T}")
        for name in ("logprobs", "ref_logprobs", "values"):
            if len(getattr(self, name)) != T:
                raise ValueError(
                    f"{name} must have one entry per token ({T}), got {len(getattr(self, name))}")
        out = {name: torch.tensor([list(map(float, getattr(self, name)))], dtype=torch.float64)
               for name in ("logprobs", "ref_logprobs", "values")}  # (1, T) each
        for name, x in out.items():
            if not bool(torch.isfinite(x).all()):
                raise ValueError(f"{name} must be finite")
        if not math.isfinite(float(self.score)):
            raise ValueError(f"score must be finite, got {self.score!r}")
        out["mask"] = torch.ones(1, T, dtype=torch.float64)  # (1, T): every token is real
        out["score"] = torch.tensor([float(self.score)], dtype=torch.float64)  # (1,)
        return out


class GAEExplorer(Explorer):
    """Sliders for gamma, lambda, the KL coefficient and the score of one response; shows per token
    the shaped reward (KL penalty + score on the last token), the critic's values, TD errors, GAE
    advantages, whitened advantages, lambda-returns and the Monte-Carlo return. lambda = 0 makes
    the advantages equal the TD errors; lambda = 1 makes the returns equal the Monte-Carlo returns.
    """

    def __init__(
        self,
        response: TokenResponse | None = None,
        gamma: float = 1.0,
        lam: float = 0.95,
        kl_coef: float = 0.1,
        kl_kind: str = "k1",
        backend: str = "auto",
    ) -> None:
        super().__init__(backend)
        self.response = response if response is not None else TokenResponse()
        self.data = self.response.tensors()
        self.number("gamma", "discount γ", gamma, 0.0, 1.0, 0.01)
        self.number("lam", "GAE λ", lam, 0.0, 1.0, 0.01)
        self.number("kl_coef", "KL coef β", kl_coef, 0.0, 1.0, 0.01)
        self.number("score", "score", float(self.response.score), -3.0, 3.0, 0.05)
        self.kind = widgets.Dropdown(options=list(drawn_kl_kinds()), value=kl_kind,
                                     description="KL estimator",
                                     style=DESCRIPTION_STYLE, layout=widgets.Layout(width="240px"))
        self.controls["kl_kind"] = self.kind
        self.view = FigureView(self._empty_figure(), self.backend)
        self.views.append(self.view)
        c = self.controls
        self._finish([widgets.HBox([widgets.VBox([c["gamma"].box, c["lam"].box]),
                                    widgets.VBox([c["kl_coef"].box, c["score"].box, self.kind])]),
                      self.view.widget])

    def _empty_figure(self) -> go.Figure:
        T = len(self.response.tokens)
        x = list(range(T))
        fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                            subplot_titles=(
                                "per-token reward r_t = −β·KL_t (+ score on the last token)",
                                "TD errors δ_t and advantages A_t",
                                "returns (critic targets) and values"))
        zeros = [0.0] * T
        bar = {"x": x, "y": zeros}
        fig.add_trace(go.Bar(**bar, name="−β·KL_t", marker={"color": "#9467bd"}), row=1, col=1)
        fig.add_trace(go.Bar(**bar, name="score", marker={"color": "#2ca02c"}), row=1, col=1)
        fig.add_trace(
            go.Scatter(**bar, name="reward r_t", mode="markers", marker={"color": "black"}),
            row=1, col=1)
        fig.add_trace(go.Scatter(**bar, name="TD error δ_t", mode="markers",
                                 marker={"size": 11, "symbol": "circle-open",
                                         "line": {"width": 2}}),
                      row=2, col=1)
        fig.add_trace(go.Bar(**bar, name="advantage A_t", marker={"color": "#1f77b4"}, opacity=0.7),
                      row=2, col=1)
        fig.add_trace(go.Scatter(**bar, name="whitened A_t", mode="markers+lines",
                                 marker={"symbol": "diamond"}, line={"dash": "dot"}), row=2, col=1)
        fig.add_trace(go.Scatter(**bar, name="return G^λ_t = A_t + V_t", mode="lines+markers",
                                 line={"width": 3}), row=3, col=1)
        fig.add_trace(go.Scatter(**bar, name="Monte-Carlo return Σ γ^l r_t+l", mode="lines",
                                 line={"dash": "dash", "color": "black"}), row=3, col=1)
        fig.add_trace(go.Scatter(**bar, name="critic V(s_t)", mode="lines+markers",
                                 line={"color": "#8c564b"}), row=3, col=1)
        ticks = [f"{t}<br>{tok.strip() or repr(tok)}" for t, tok in enumerate(self.response.tokens)]
        fig.update_xaxes(tickvals=x, ticktext=ticks, row=3, col=1)
        fig.update_layout(height=720, width=FIGURE_WIDTH, font=FIGURE_FONT,
                          barmode="relative", template="plotly_white", uirevision="keep",
                          margin={"l": 60, "r": 30, "t": 60, "b": 60},
                          legend={"orientation": "h", "y": -0.1})
        return fig

    def compute(self, gamma: float, lam: float, kl_coef: float, score: float, kl_kind: str
                ) -> dict[str, torch.Tensor]:
        """Every per-token series on screen, as (T,) tensors, from the maths core."""
        d = self.data
        scores = torch.tensor([score], dtype=torch.float64)  # (1,)
        logp, ref, mask = d["logprobs"], d["ref_logprobs"], d["mask"]
        rewards, kl = shape_rewards(scores, logp, ref, mask, kl_coef, kl_kind)  # (1, T) each
        no_score = torch.zeros_like(scores)  # (1,): a score of 0 leaves the KL part alone
        penalty, _ = shape_rewards(no_score, logp, ref, mask, kl_coef, kl_kind)  # (1, T)
        deltas = td_errors(rewards, d["values"], mask, gamma)  # (1, T)
        advantages, returns = compute_gae(rewards, d["values"], mask, gamma, lam)  # (1, T) each
        # Monte-Carlo return G_t = sum_l gamma^l r_{t+l}: GAE's return with V = 0 and lambda = 1
        _, mc_returns = compute_gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)  # (1, T)
        whitened = masked_whiten(advantages, d["mask"])  # (1, T)
        series = {"kl": kl, "penalty": penalty, "score_part": rewards - penalty, "rewards": rewards,
                  "deltas": deltas, "advantages": advantages, "whitened": whitened,
                  "returns": returns, "mc_returns": mc_returns, "values": d["values"]}
        return {name: x[0] for name, x in series.items()}

    def _render(self) -> str:
        v = self.values()
        s = self.compute(v["gamma"], v["lam"], v["kl_coef"], v["score"], v["kl_kind"])
        order = {KL_PART: "penalty", SCORE_PART: "score_part", REWARD: "rewards", TD: "deltas",
                 ADVANTAGE: "advantages", WHITENED: "whitened", RETURN: "returns",
                 MC_RETURN: "mc_returns", VALUE: "values"}
        with self.view.batch() as fig:
            for index, name in order.items():
                fig.data[index].y = s[name].numpy()
            fig.layout.title = {"text": f"GAE: γ = {v['gamma']:g}, λ = {v['lam']:g}, β = "
                                f"{v['kl_coef']:g} ({v['kl_kind']})", "x": 0.01}
        gap_td = float((s["advantages"] - s["deltas"]).abs().max())
        gap_mc = float((s["returns"] - s["mc_returns"]).abs().max())
        lines = [f"sum of KL_t = {float(s['kl'].sum()):.3f};  total reward = "
                 f"{float(s['rewards'].sum()):.3f}"]
        if v["lam"] == 0:
            lines.append("λ = 0 is one-step TD: the advantages equal the TD errors (max |A − δ| = "
                         f"{gap_td:.2g}).")
        elif v["lam"] == 1:
            lines.append("λ = 1 is Monte-Carlo: the returns equal the discounted reward-to-go and "
                         f"A_t = reward-to-go − V_t (max |difference| = {gap_mc:.2g}).")
        else:
            gl = v["gamma"] * v["lam"]
            horizon = "∞" if gl >= 1 else f"{1 / (1 - gl):.1f}"
            lines.append(f"γλ = {gl:.3g}: a TD error counts with weight (γλ)^l, an effective "
                         f"horizon of ~{horizon} tokens (max |A − δ| = {gap_td:.2g}, max |return − "
                         f"G| = {gap_mc:.2g}).")
        return "\n".join(lines)
