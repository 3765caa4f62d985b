"""A plotly figure as a mime bundle that needs no plotly renderer in the frontend: self-contained
HTML whose own script loads plotly.js (once per page) before drawing, plus plotly's JSON mime type.

Used by the "html" display backend (see `backends`). Why each part:

- text/html: every Jupyter frontend renders it and runs its scripts in live output (Colab,
  JupyterLab, Notebook 7, VS Code). The script does not assume `Plotly` is defined: it adds a
  <script> for plotly.js from plotly's CDN (the URL plotly's own "colab" renderer uses) and draws in
  its onload. plotly's "colab" HTML instead puts `<script src=...>` next to an inline
  `Plotly.newPlot(...)`; a frontend that inserts scripts into the page (JupyterLab, the Output
  widget) loads the src asynchronously and runs the inline one first: "Plotly is not defined"
  (colabtools#5889).
- application/vnd.plotly.v1+json (optional; the "html" backend adds it to a figure's first display
  outside Colab): the figure's JSON, which JupyterLab, Notebook 7 and VS Code draw with the
  plotly.js of their own plotly extension, offline, ranked above text/html. Saved notebooks then
  show the figure without internet (their HTML scripts do not run until trusted), and hold no
  plotly.js.
"""

from __future__ import annotations

import json
import uuid

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs_version

#: plotly's own mime type (JupyterLab/VS Code render it)
PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: the global promise shared by every figure on a page, so plotly.js is fetched once, not per draw
READY_GLOBAL = "rlhfPlotlyReady"


def plotly_js_url() -> str:
    """plotly.js on plotly's CDN, the version this plotly.py was built for (as its "cdn" option)."""
    return f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"


# Placeholders are replaced with str.replace (the JavaScript is full of braces). ES5: any browser.
_TEMPLATE = """<div id="@ID@" class="rlhf-figure" style="width:@WIDTH@;height:@HEIGHT@"></div>
<script type="text/javascript">
(function () {
  var me = document.currentScript, id = "@ID@";
  var div = me && me.previousElementSibling && me.previousElementSibling.id === id
    ? me.previousElementSibling : document.getElementById(id);
  var fig = @FIGURE@;
  var url = "@URL@";
  function draw() { window.Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false}); }
  function fail() {
    div.textContent = "This figure needs plotly.js from " + url +
      ", which did not load (offline?). In JupyterLab, backend='figurewidget' works offline.";
  }
  if (window.Plotly) { draw(); return; }
  if (!window.@READY@) {
    window.@READY@ = new Promise(function (resolve, reject) {
      if (typeof window.define === "function" && window.define.amd && window.requirejs) {
        // require.js (classic Notebook 6): plotly.js registers as an AMD module, not window.Plotly
        window.requirejs.config({paths: {rlhf_plotly: url.replace(/\\.js$/, "")}});
        window.requirejs(["rlhf_plotly"], function (P) { window.Plotly = P; resolve(); }, reject);
        return;
      }
      var script = document.createElement("script");
      script.src = url;
      script.charset = "utf-8";
      script.onload = function () { if (window.Plotly) { resolve(); } else { reject(); } };
      script.onerror = reject;
      document.head.appendChild(script);
    });
    window.@READY@.catch(function () { window.@READY@ = null; });  // the next draw tries again
  }
  window.@READY@.then(draw, fail);
})();
</script>"""


def _css_size(value: object) -> str:
    return f"{int(value)}px" if value else "100%"


def figure_html(fig_json: str, layout: go.Layout, element_id: str | None = None) -> str:
    """The figure as one <div> plus the script that loads plotly.js if needed and draws into it.

    `fig_json` is the figure as JSON (`plotly.io.to_json`); the div takes the layout's width and
    height so the output keeps its size while plotly.js loads (no jump below the figure).
    """
    element_id = element_id or f"rlhf-figure-{uuid.uuid4().hex}"
    # a "</script>" inside a string must not end the script
    safe_json = fig_json.replace("</", "<\\/")
    return (_TEMPLATE.replace("@FIGURE@", safe_json).replace("@ID@", element_id)
            .replace("@URL@", plotly_js_url()).replace("@READY@", READY_GLOBAL)
            .replace("@WIDTH@", _css_size(layout.width))
            .replace("@HEIGHT@", _css_size(layout.height or 450)))


def mime_bundle(fig: go.Figure, with_plotly_mime: bool = True) -> dict[str, object]:
    """{'text/html': ..., PLOTLY_MIME: ...} for `display(bundle, raw=True)`; the plotly JSON part
    only if `with_plotly_mime` (a frontend that knows that type prefers it to the HTML)."""
    fig_json = pio.to_json(fig, validate=False)  # plotly's encoder: numpy arrays, NaN, dates
    bundle: dict[str, object] = {"text/html": figure_html(fig_json, fig.layout)}
    if with_plotly_mime:
        bundle[PLOTLY_MIME] = json.loads(fig_json)
    return bundle
