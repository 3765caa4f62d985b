"""The explorers without a kernel: a plotly figure with sliders whose every position was drawn in
Python.

For the course's static site (`make site`). Each combination of the sliders' values is set on the
explorer itself (`Explorer.set`), which computes it with the maths core as in the notebook; the
traces that change, the title and the shaded regions are stored per combination, and a small script
swaps them in when a slider moves (with the site's `rlhfFigures.redraw`,
site/static/rlhf-figures.js, which also lays the figure out for the page's width and puts the
sliders above the curves). So the site shows the widget's own numbers: one source of truth. The grid
of values is kept small (tens of combinations) so the pages stay small. Under the figure, a caption
names its sliders and the controls held fixed (`static_explorer_caption`).

    figure = static_explorer("ClipExplorer", {"eps": 0.2, "advantage": 1.0, "ratio": 1.3})
    html = static_explorer_html(figure, "explorer-1")  # <div>, <script> (needs site JS), caption
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import math
from dataclasses import dataclass

import numpy as np

from rlhf_helpers.widgets._base import Explorer
from rlhf_helpers.widgets.clip_explorer import ClipExplorer
from rlhf_helpers.widgets.gae_explorer import GAEExplorer
from rlhf_helpers.widgets.kl_explorer import KLExplorer
from rlhf_helpers.widgets.value_clip_explorer import ValueClipExplorer

EXPLORERS: dict[str, type[Explorer]] = {cls.__name__: cls for cls in
                                        (ClipExplorer, GAEExplorer, KLExplorer, ValueClipExplorer)}
SIGNIFICANT = 7  #: significant digits kept of every number (the page's JSON stays short)
#: height of one slider with its current-value label and ticks, in px (as
#: site/static/rlhf-figures.js)
SLIDER_PX = 92


@dataclass(frozen=True)
class SiteSlider:
    """One slider of a static explorer: the explorer control it sets, and the values it offers."""

    name: str
    """the explorer's control (a key of `Explorer.controls`), e.g. "advantage\""""
    label: str
    """the prefix of the slider's current-value line, e.g. "advantage A = \""""
    values: tuple[float, ...]
    """the positions; the notebook's own value is added when it is not one of them"""


def _steps(lo: float, hi: float, step: float) -> tuple[float, ...]:
    """lo, lo + step, ..., hi, rounded (no 0.30000000000000004)."""
    return tuple(round(lo + i * step, 6) for i in range(round((hi - lo) / step) + 1))


#: the sliders each explorer gets on the site: the controls its notebook text asks the reader to
#: move
SITE_SLIDERS: dict[str, tuple[SiteSlider, ...]] = {
    # ε must be > 0 (the maths core refuses 0); 04 asks for the smallest ε: 0.01 live, 0.05 here
    "ClipExplorer": (SiteSlider("advantage", "advantage A = ", _steps(-2.0, 2.0, 0.5)),
                     SiteSlider("eps", "clip ε = ", (0.05, 0.1, 0.2, 0.3))),
    "GAEExplorer": (SiteSlider("lam", "GAE λ = ", _steps(0.0, 1.0, 0.1)),
                    SiteSlider("kl_coef", "KL coef β = ", (0.0, 0.05, 0.1, 0.2, 0.5))),
    "KLExplorer": (SiteSlider("shift", "π far from ref: ", _steps(0.0, 3.0, 0.25)),),
    "ValueClipExplorer": (SiteSlider("ret", "return G^λ = ", _steps(-1.0, 2.5, 0.5)),
                          SiteSlider("value_clip", "clip range ε_V = ", (0.1, 0.2, 0.5, 1.0))),
}
#: grid points of the curves on the site (the notebook's explorers use 601 and 501: smooth, but 4x
#: the bytes)
SITE_OPTIONS: dict[str, dict[str, object]] = {"ClipExplorer": {"points": 121},
                                              "ValueClipExplorer": {"points": 101}}
#: controls that matter only while another control is on: the caption leaves them out while it is
#: off
ONLY_WHEN_ON = {"dual_clip": "dual"}


def _plain(value: object) -> object:
    """Figure JSON with arrays as lists and floats cut to SIGNIFICANT digits (NaN/inf -> None).
    plotly >= 6 writes numpy arrays as base64 typed arrays ({"dtype", "bdata"}): decoded, so states
    can be compared."""
    if isinstance(value, dict) and "bdata" in value and "dtype" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return _plain(array.reshape(value["shape"]) if "shape" in value else array)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, (float, np.floating)):
        x = float(value)
        return float(f"{x:.{SIGNIFICANT}g}") if math.isfinite(x) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _snapshot(explorer: Explorer) -> dict:
    """The explorer's current figure as plain JSON (data and layout)."""
    return _plain(explorer.view.figure.to_plotly_json())


def static_explorer(kind: str, controls: dict[str, object], **options: object) -> dict:
    """A plotly figure (JSON) of explorer `kind` at `controls`, with one slider per SITE_SLIDERS
    entry.

    `controls`: the value of every control to start from (the notebook's, e.g. from its saved widget
    state); `options`: constructor arguments (ratios, ratio_range, value_range, ...). Returns
    {"data", "layout", "states", "traces", "strides", "kind", "controls"}: states[k] holds, for the
    k-th combination of slider positions (row-major, `strides`), the x/y of the traces that change
    and the title, shapes and annotations; "labels": each control's label in the notebook ("clip
    ε"). Raises ValueError if the explorer rejects a combination.
    """
    if kind not in EXPLORERS:
        raise ValueError(f"kind must be one of {sorted(EXPLORERS)}, got {kind!r}")
    sliders = SITE_SLIDERS[kind]
    explorer = EXPLORERS[kind](backend="html", **{**SITE_OPTIONS.get(kind, {}), **options})
    controls = {name: value for name, value in controls.items() if name in explorer.controls}
    labels = {name: getattr(control, "slider", control).description
              for name, control in explorer.controls.items()}
    start = {**explorer.values(), **controls}
    # the notebook's value is a step
    values = [sorted({*s.values, float(start[s.name])}) for s in sliders]
    active = [v.index(float(start[s.name])) for s, v in zip(sliders, values, strict=True)]

    snapshots = []
    for combo in itertools.product(*values):
        explorer.set(**{**start, **{s.name: v for s, v in zip(sliders, combo, strict=True)}})
        if explorer.error is not None:
            raise ValueError(
                f"{kind} rejects {dict(zip([s.name for s in sliders], combo, strict=True))}: "
                f"{explorer.error}")
        snapshots.append(_snapshot(explorer))
    strides = [math.prod(len(v) for v in values[i + 1:]) for i in range(len(values))]
    first = snapshots[sum(a * s for a, s in zip(active, strides, strict=True))]

    # only what differs between combinations goes into the states: x and y of the traces that move
    changing = {key: [i for i, trace in enumerate(first["data"])
                      if any(snap["data"][i].get(key) != trace.get(key) for snap in snapshots)]
                for key in ("x", "y")}
    traces = sorted(set(changing["x"]) | set(changing["y"]))
    moving = [key for key in ("title", "shapes", "annotations")
              if any(snap["layout"].get(key) != first["layout"].get(key) for snap in snapshots)]
    states = [{"x": {str(i): snap["data"][i]["x"] for i in changing["x"]},
               "y": {str(i): snap["data"][i]["y"] for i in changing["y"]},
               "layout": {key: snap["layout"].get(key, []) for key in moving}}
              for snap in snapshots]

    layout = _with_sliders(first["layout"], sliders, values, active)
    return {"kind": kind, "data": first["data"], "layout": layout, "states": states,
            "traces": traces, "strides": strides, "controls": _plain(start), "labels": labels}


def _with_sliders(layout: dict, sliders: tuple[SiteSlider, ...], values: list[list[float]],
                  active: list[int]) -> dict:
    """`layout` (changed in place) with one plotly slider per site slider above the curves."""
    layout.pop("width", None)  # follow the page's width
    margin = layout.setdefault("margin", {})
    # the sliders sit between the title and the curves, so the curve a slider moves stays in view
    # while it is dragged; the page's script (site/static/rlhf-figures.js) places them and the
    # legend for the width it draws at
    margin["t"] = round(float(margin.get("t", 60)) + SLIDER_PX * len(sliders))
    layout["height"] = round(float(layout.get("height", 500)) + SLIDER_PX * len(sliders))
    plot = max(1.0, layout["height"] - margin["t"] - float(margin.get("b", 50)))  # px of the curves
    layout["sliders"] = [
        {"name": s.name, "active": a, "x": 0.0, "len": 1.0, "xanchor": "left", "yanchor": "top",
         "y": 1.0 + SLIDER_PX * (len(sliders) - i) / plot,
         "pad": {"t": 4, "b": 4}, "currentvalue": {"prefix": s.label, "font": {"size": 14}},
         "steps": [{"label": f"{v:g}", "value": f"{v:g}", "method": "skip"} for v in vals]}
        for i, (s, vals, a) in enumerate(zip(sliders, values, active, strict=True))]
    return layout


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def static_explorer_caption(figure: dict) -> str:
    """One line for under the figure: which controls its sliders move, the others' values, where to
    move those.

    e.g. "On this page: sliders for advantage A and clip ε. Fixed here: ratio ρ = 1.3, dual clip
    off. Run the notebook (JupyterLab or Colab) to move the others." """
    labels, controls = figure["labels"], figure["controls"]
    moving = [s["name"] for s in figure["layout"]["sliders"]]
    fixed = []
    for name, value in controls.items():
        hidden = name in ONLY_WHEN_ON and not controls.get(ONLY_WHEN_ON[name])
        if name in moving or name not in labels or hidden:
            continue
        if isinstance(value, bool):
            fixed.append(f"{labels[name]} {'on' if value else 'off'}")
        else:
            fixed.append(f"{labels[name]} = {value:g}" if isinstance(value, (int, float)) else
                         f"{labels[name]} = {value}")
    lead = "a slider for " if len(moving) == 1 else "sliders for "
    sliders = lead + _listing([labels[n] for n in moving])
    rest = f" Fixed here: {', '.join(fixed)}." if fixed else ""
    return (f"On this page: {sliders}.{rest} Run the notebook (JupyterLab or Colab) to move the "
            "others.")


# `Plotly` and `rlhfFigures` may load after this script (deferred): wait for the page
_SCRIPT = """(function () {
  var spec = @SPEC@;
  var names = spec.layout.sliders.map(function (s) { return s.name; });
  var active = spec.layout.sliders.map(function (s) { return s.active; });
  function state() {
    var s = spec.states[active.reduce(function (k, a, i) { return k + a * spec.strides[i]; }, 0)];
    var x = [], y = [];  // every moving trace gets both (a missing x would be dropped by plotly.js)
    spec.traces.forEach(function (i) {
      x.push(s.x[i] !== undefined ? s.x[i] : spec.data[i].x);
      y.push(s.y[i] !== undefined ? s.y[i] : spec.data[i].y);
    });
    return [{x: x, y: y}, s.layout];
  }
  function draw() {
    var gd = document.getElementById("@ID@");
    // rlhfFigures (the site's script) fits the layout to the page's width again at every move
    rlhfFigures.draw(gd, spec.data, spec.layout).then(function () {
      gd.on("plotly_sliderchange", function (event) {
        active[names.indexOf(event.slider.name)] = event.slider.active;
        var next = state(), data = spec.data.slice();
        var layout = Object.assign({}, spec.layout, next[1]);
        spec.traces.forEach(function (i, k) {
          data[i] = Object.assign({}, spec.data[i], {x: next[0].x[k], y: next[0].y[k]});
        });
        layout.sliders = spec.layout.sliders.map(function (s, k) {
          return Object.assign({}, s, {active: active[k]});
        });
        rlhfFigures.redraw(gd, data, layout);
      });
    });
  }
  if (window.Plotly && window.rlhfFigures) { draw(); }
  else { window.addEventListener("load", draw); }
})();"""


def static_explorer_html(figure: dict, element_id: str) -> str:
    """A <div> and the <script> that draws `figure` (from `static_explorer`) in it with the page's
    plotly.js and the site's rlhfFigures, and swaps in the stored state when a slider moves, then
    the caption (`static_explorer_caption`). The div's data attributes name the explorer and its
    starting controls (for tests)."""
    spec = json.dumps(
        {key: figure[key] for key in ("data", "layout", "states", "traces", "strides")},
        separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    height = figure["layout"].get("height", 500)
    controls = html.escape(json.dumps(figure["controls"]), quote=True)
    script = _SCRIPT.replace("@ID@", element_id).replace("@SPEC@", spec)
    return (f'<div id="{element_id}" class="rlhf-static-explorer" data-explorer="{figure["kind"]}" '
            f'data-controls="{controls}" style="width:100%;height:{height}px"></div>\n'
            f'<script type="text/javascript">\n{script}'
            "\n</script>\n"
            f'<p class="rlhf-explorer-caption">{html.escape(static_explorer_caption(figure))}</p>')
