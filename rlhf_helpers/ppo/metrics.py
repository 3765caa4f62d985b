"""Names and one-line meanings of the metrics `PPOTrainer.step` logs, a plotly figure of their
curves, and the run folder's metrics.jsonl / curves.html writers.

    from rlhf_helpers.ppo.metrics import GLOSSARY, plot_curves
    fig = plot_curves(trainer.history, keys=("score", "hidden_score", "kl"))

docs/metrics.md is the long form (generated from rlhf_helpers.ppo.metric_docs): formulas, healthy
ranges, failure modes. Imports only plotly (lazily), so notebooks can use it without loading a
model. The writers never write through a link at the file's name (a run folder is a folder people
use too); the training command's curves.html, titled with the run and marked with the doctor's
findings, is drawn by `stages.curves_page`.
"""

from __future__ import annotations

import errno
import html
import json
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.metric_docs import METRICS
from rlhf_helpers.runtime.figure_template import course_template
from rlhf_helpers.runtime.lock_files import file_kind

#: metric name -> one line: what it is (derived from metric_docs.METRICS, which also holds each
#: metric's formula, healthy range and failure modes; docs/metrics.md is generated from it).
GLOSSARY: dict[str, str] = {name: doc.meaning for name, (_group, doc) in METRICS.items()}

#: The curves worth watching first, in the order `plot_curves` draws them by default.
DEFAULT_CURVES = ("score", "hidden_score", "kl", "entropy", "clipfrac", "approx_kl", "value_loss",
                  "explained_variance", "response_length")


def describe(name: str) -> str:
    """The glossary line of a metric; ValueError for a name the glossary does not know."""
    if name not in GLOSSARY:
        raise ValueError(
            f"name must be a metric of the glossary ({sorted(GLOSSARY)}), got {name!r}")
    return GLOSSARY[name]


def default_keys(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The DEFAULT_CURVES a history logs, in their order: what `plot_curves` draws when not told."""
    present = {k for row in history for k in row}
    return [k for k in DEFAULT_CURVES if k in present]


def curve(history: Sequence[Mapping[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric over a history; rows without the key (or with NaN) skipped."""
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
    metrics.jsonl; `keys` defaults to the DEFAULT_CURVES present in it. Panel titles are metric
    names; hovering a point shows the glossary line.
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
        keys = default_keys(history)
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


def write_replacing(path: Path, text: str) -> None:
    """Write `text` as the whole of `path`: into a new file beside it, renamed over it. A link at
    `path` (a file of someone's, linked into the run folder) is replaced by the rename, never
    written through."""
    partial = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    # O_EXCL: a name that exists, even a dangling link, is never opened; 0o666: umask sets the mode
    descriptor = os.open(partial,
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _jsonl(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as JSON lines (NaN/inf become null so every line is valid JSON)."""
    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return "".join(json.dumps({k: clean(v) for k, v in row.items()}) + "\n" for row in rows)


def append_jsonl(path: Path, rows: Sequence[dict[str, Any]], mode: str = "a") -> None:
    """Write rows one JSON object per line (NaN/inf become null so every line is valid JSON): mode
    "w" writes the file anew (`write_replacing`), "a" appends to a regular file of one name, never
    through a link (OSError naming what is there: an append cannot replace the file, so a link is
    refused)."""
    if mode == "w":
        write_replacing(path, _jsonl(rows))
        return
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW",
                                                             0) | getattr(os, "O_CLOEXEC", 0)
    try:  # non-blocking: a named pipe with no reader must not hang the run
        descriptor = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o666)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        descriptor, kind = None, "a symbolic link"
    else:
        kind = file_kind(os.fstat(descriptor))
    if kind is not None:
        if descriptor is not None:
            os.close(descriptor)
        raise OSError(f"{path} is {kind}, not a regular file of one name: the run never writes "
                      "into it (the file a link names keeps its bytes); move it away")
    if getattr(os, "O_NONBLOCK", 0):  # opened non-blocking only for the pipe case above
        os.set_blocking(descriptor, True)
    with os.fdopen(descriptor, "a", encoding="utf-8") as handle:
        handle.write(_jsonl(rows))
        handle.flush()


def write_curves(history: Sequence[Mapping[str, float]], path: Path, figure: Any = None,
                 page_title: str = "PPO training curves") -> None:
    """curves.html: `figure` (default: `plot_curves(history)` in the course's template) as a page of
    its own, named `page_title` in the browser's tab, as wide as the window, plotly.js inlined
    (opens offline), written by `write_replacing`. Writes nothing for an empty history."""
    if not history:
        return
    if figure is None:
        figure = plot_curves(history).update_layout(template=course_template())
    page = figure.to_html(include_plotlyjs=True, full_html=True, config={"responsive": True})
    # a tab named after the run; a phone's browser lays the page out at its width, not a desktop's
    head = (f"    <title>{html.escape(page_title)}</title>\n"
            '    <meta name="viewport" content="width=device-width, initial-scale=1" />\n</head>')
    write_replacing(path, page.replace("</head>", head, 1))
