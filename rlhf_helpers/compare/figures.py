"""The comparison's pictures: hidden score against KL (the frontier), against training seconds and
against the responses trained on; best-of-n of the SFT model as the untrained reference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: One colour per method (several seeds of a method share it).
COLORS = {"ppo": "#1f77b4", "grpo": "#2ca02c", "rloo": "#9467bd", "dpo": "#e377c2"}
BEST_OF_COLORS = {1: "#7f7f7f", 4: "#ff7f0e", 16: "#d62728"}


def _row(run: Any, key: str) -> list[float]:
    curve = run["curve"] if isinstance(run, Mapping) else run.curve
    return [row[key] for row in curve]


def _field(run: Any, name: str) -> Any:
    return run[name] if isinstance(run, Mapping) else getattr(run, name)


def comparison_figure(runs: Sequence[Any], best_of: Mapping[int, Mapping[str, float]],
                      title: str = "", clock: str = "cpu") -> Any:
    """A plotly figure of MethodRuns (or their dicts), 920 px wide to fit a notebook: the frontier
    (hidden score against KL) across the top, hidden score against training seconds and against
    responses trained on below it. Every evaluation of every run is a point on a line per run;
    best-of-n is a diamond on the frontier and a dashed line in the other two panels."""
    # plotly: imported only when a figure is drawn
    from plotly.subplots import make_subplots

    seconds = "training CPU seconds" if clock == "cpu" else "training seconds (GPU, wall)"
    fig = make_subplots(rows=2, cols=2, specs=[[{"colspan": 2}, None], [{}, {}]],
                        horizontal_spacing=0.1, vertical_spacing=0.16, subplot_titles=(
        "hidden score against KL to the SFT model", f"hidden score against {seconds}",
        "hidden score against responses trained on"))
    shown = set()
    for run in runs:
        method = _field(run, "method")
        seed = (_field(run, "settings") or {}).get("seed")
        color = COLORS.get(method, "#17becf")
        hidden = _row(run, "eval_hidden_score")
        common = {"mode": "lines+markers", "line": {"color": color, "width": 2},
                  "marker": {"size": 6}, "legendgroup": method, "showlegend": method not in shown,
                  "name": _field(run, "label"),
                  "text": [f"seed {seed}" if seed is not None else "" for _ in hidden]}
        shown.add(method)
        fig.add_scatter(x=_row(run, "eval_kl"), y=hidden, row=1, col=1, **common)
        fig.add_scatter(x=_row(run, "train_seconds"), y=hidden, row=2, col=1,
                        **{**common, "showlegend": False})
        fig.add_scatter(x=_row(run, "samples"), y=hidden, row=2, col=2,
                        **{**common, "showlegend": False})
    for n, row in sorted(best_of.items(), key=lambda item: int(item[0])):
        n = int(n)
        color = BEST_OF_COLORS.get(n, "#8c564b")
        fig.add_scatter(x=[row["kl"]], y=[row["hidden"]], mode="markers", name=f"SFT best-of-{n}",
                        marker={"size": 13, "symbol": "diamond", "color": color}, row=1, col=1)
        fig.add_hline(y=row["hidden"], line={"dash": "dash", "color": color, "width": 1.2}, row=2,
                      col=1, annotation_text=f"best-of-{n}", annotation_position="bottom right",
                      annotation_font={"color": color, "size": 11})
        fig.add_hline(
            y=row["hidden"], line={"dash": "dash", "color": color, "width": 1.2}, row=2, col=2)
    fig.update_xaxes(
        title_text="KL(policy || SFT), nats per response", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text=seconds + " (evaluations excluded)", rangemode="tozero",
                     row=2, col=1)
    fig.update_xaxes(title_text="responses trained on (DPO: of its pairs)", rangemode="tozero",
                     row=2, col=2)
    fig.update_yaxes(title_text="mean hidden score (held-out prompts)", row=1, col=1)
    fig.update_yaxes(title_text="mean hidden score", row=2, col=1)
    fig.update_layout(width=920, height=780, template="plotly_white", font={"size": 12},
                      title={"text": title or "PPO vs GRPO vs RLOO vs DPO vs best-of-n: same "
                                              "judge, same budget", "x": 0.01},
                      margin={"l": 60, "r": 20, "t": 80, "b": 60},
                      legend={"orientation": "h", "y": -0.12, "x": 0.0})
    return fig
