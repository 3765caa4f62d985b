"""Names and one-line meanings of the metrics `PPOTrainer.step` logs, a plotly figure of their curves, and the
run folder's metrics.jsonl / curves.html writers.

    from rlhf_helpers.ppo.metrics import GLOSSARY, plot_curves
    fig = plot_curves(trainer.history, keys=("score", "hidden_score", "kl"))

docs/metrics.md is the long form (generated from rlhf_helpers.ppo.metric_docs): formulas, healthy ranges,
failure modes. Imports only plotly (lazily), so notebooks can use it without loading a model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.metric_docs import METRICS

#: metric name -> one line: what it is (derived from metric_docs.METRICS, which also holds each metric's
#: formula, healthy range and failure modes; docs/metrics.md is generated from it).
GLOSSARY: dict[str, str] = {name: doc.meaning for name, (_group, doc) in METRICS.items()}

#: The curves worth watching first, in the order `plot_curves` draws them by default.
DEFAULT_CURVES = ("score", "hidden_score", "kl", "entropy", "clipfrac", "approx_kl", "value_loss",
                  "explained_variance", "response_length")


def describe(name: str) -> str:
    """The glossary line of a metric; ValueError for a name the glossary does not know."""
    if name not in GLOSSARY:
        raise ValueError(f"name must be a metric of the glossary ({sorted(GLOSSARY)}), got {name!r}")
    return GLOSSARY[name]


def curve(history: Sequence[Mapping[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric over a history; rows without the key (or with NaN) are skipped."""
    xs, ys = [], []
    for index, row in enumerate(history):
        value = row.get(key)
        if value is None or not math.isfinite(float(value)):
            continue
        xs.append(float(row.get("step", index + 1)))
        ys.append(float(value))
    return xs, ys


def plot_curves(history: Sequence[Mapping[str, float]], keys: Sequence[str] | None = None,
                columns: int = 3, title: str = "PPO training curves") -> Any:
    """A plotly figure with one small panel per metric against the PPO step.

    `history` is `PPOTrainer.history` (a list of per-step metric dicts) or the rows of a
    metrics.jsonl; `keys` defaults to the DEFAULT_CURVES present in it. Panel titles are metric names;
    hovering a point shows the glossary line.
    """
    # plotly: imported only when a figure is drawn
    import plotly.graph_objects as go

    # plotly: imported only when a figure is drawn
    from plotly.subplots import make_subplots

    if not history:
        raise ValueError("history must hold at least one step of metrics")
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    present = {k for row in history for k in row}
    if keys is None:
        keys = [k for k in DEFAULT_CURVES if k in present]
    else:
        missing = [k for k in keys if k not in present]
        if missing:
            raise ValueError(f"keys {missing} are not in the history (it has {sorted(present)})")
    if not keys:
        raise ValueError("keys must name at least one metric")
    rows = math.ceil(len(keys) / columns)
    fig = make_subplots(rows=rows, cols=min(columns, len(keys)), subplot_titles=list(keys))
    for index, key in enumerate(keys):
        xs, ys = curve(history, key)
        meaning = GLOSSARY.get(key, key)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=key, showlegend=False,
                                 hovertemplate=f"step %{{x}}<br>{key} = %{{y:.4g}}<br>{meaning}"
                                               "<extra></extra>"),
                      row=index // columns + 1, col=index % columns + 1)
    fig.update_xaxes(title_text="PPO step")
    fig.update_layout(title=title, height=260 * rows, margin=dict(t=80, l=40, r=20, b=40))
    return fig


def append_jsonl(path: Path, rows: Sequence[dict[str, Any]], mode: str = "a") -> None:
    """Write rows one JSON object per line (NaN/inf become null so every line is valid JSON)."""
    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    with open(path, mode, encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({k: clean(v) for k, v in row.items()}) + "\n")
        handle.flush()


def write_curves(history: Sequence[dict[str, float]], path: Path) -> None:
    """curves.html with plotly.js inlined (opens offline)."""
    if history:
        plot_curves(history).write_html(str(path), include_plotlyjs=True)
