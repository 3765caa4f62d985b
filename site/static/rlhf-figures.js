/* The course's plotly figures fitted to the width they are drawn at (the static site; needs the page's plotly.js).

   A figure is stored once, laid out for a notebook's output area. `rlhfFigures.draw(gd, data, layout)` lays it out
   again for the width of `gd` before plotly draws it, and again when the window's width changes:
   - every title (the figure's, each panel's, each axis's) is broken at spaces into lines that fit the width it has,
     measured with the figure's own font; the top margin grows by the lines added;
   - the toolbar is left off narrow figures, where it would sit on the title; on wide ones the title wraps before it;
   - on a narrow figure (a phone), panels side by side are stacked into one column, and a legend at the right moves
     under the plot, in rows;
   - an explorer's sliders (a layout with `sliders`) sit between the title and the curves, so that the curve a
     slider moves is in view while it is dragged; the curves get at most what the window leaves them.
   No dependencies besides Plotly. */
(function () {
  "use strict";
  var NARROW_PX = 600;      // below this width: one column of panels, the legend under the plot, no toolbar
  var TOOLBAR_PX = 290;     // room the toolbar takes at the top right of a wide figure (up to 11 buttons)
  var SLIDER_PX = 92;       // one slider: its current-value line, the rail and the step labels
  var LINE = 1.3;           // a text line's height per px of font size
  var PLOTLY_FONT = '"Open Sans", verdana, arial, sans-serif';  // plotly's own default
  var ruler = null;

  // the width plotly's svg text takes: measured with an svg text of the same font, as plotly draws it
  function textPx(text, size, family) {
    if (!ruler) {
      var svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
      svg.setAttribute("style", "position:absolute;left:-10000px;top:0;width:10px;height:10px;visibility:hidden");
      ruler = document.createElementNS("http://www.w3.org/2000/svg", "text");
      svg.appendChild(ruler);
      document.body.appendChild(svg);
    }
    ruler.style.fontFamily = family;
    ruler.style.fontSize = size + "px";
    ruler.textContent = String(text).replace(/<[^>]+>/g, "");
    return ruler.getComputedTextLength();
  }

  // `text` broken at spaces (existing <br> kept) into lines no wider than `px`; a longer word keeps its own line
  function wrap(text, px, size, family) {
    if (!text) return text;
    var out = [];
    String(text).split(/<br\s*\/?>/i).forEach(function (line) {
      var current = "";
      line.split(" ").forEach(function (word) {
        var next = current ? current + " " + word : word;
        if (current && textPx(next, size, family) > px) { out.push(current); current = word; }
        else { current = next; }
      });
      out.push(current);
    });
    return out.join("<br>");
  }

  function unwrap(text) { return text ? String(text).replace(/<br\s*\/?>/gi, " ") : text; }
  function lines(text) { return text ? String(text).split(/<br\s*\/?>/i).length : 0; }
  function copy(value) { return JSON.parse(JSON.stringify(value)); }
  function pick() {
    for (var i = 0; i < arguments.length; i++) {
      if (arguments[i] !== undefined && arguments[i] !== null) return arguments[i];
    }
    return undefined;
  }
  function get(object, path) {
    return path.split(".").reduce(function (o, key) {
      return o === undefined || o === null ? undefined : o[key];
    }, object);
  }
  function titleText(title) { return typeof title === "string" ? title : title && title.text; }
  function setTitle(owner, key, text) {
    if (typeof owner[key] === "string") { owner[key] = text; return; }
    owner[key] = owner[key] || {};
    owner[key].text = text;
  }

  // the layout's panels: each x axis that is not an overlay, with the y axis it is drawn against
  function panels(layout) {
    var found = [];
    Object.keys(layout).forEach(function (key) {
      if (!/^xaxis\d*$/.test(key) || layout[key].overlaying) return;
      var x = layout[key], yKey = "yaxis" + String(x.anchor || "y").slice(1);
      var y = layout[yKey] || {};
      found.push({x: key, y: yKey, xd: (x.domain || [0, 1]).slice(), yd: (y.domain || [0, 1]).slice()});
    });
    return found;
  }

  function columns(found) {
    var starts = [];
    found.forEach(function (p) {
      if (!starts.some(function (s) { return Math.abs(s - p.xd[0]) < 0.02; })) starts.push(p.xd[0]);
    });
    return starts.length;
  }

  function isPanelTitle(a, p) {
    return a.xref === "paper" && a.yref === "paper" && Math.abs(a.x - (p.xd[0] + p.xd[1]) / 2) < 1e-3
      && Math.abs(a.y - p.yd[1]) < 1e-3;
  }

  // the figure's layout for a `width` x `height` window
  // `extra` (settle's measures): {gaps: px more for each gap between stacked panels, legend: px more above the
  // legend under the plot}; `info.stack` gets the stacked panels
  function fit(source, width, windowHeight, extra, info) {
    var layout = copy(source);
    var template = get(layout, "template.layout") || {};
    var narrow = width < NARROW_PX;
    var family = pick(get(layout, "font.family"), get(template, "font.family"), PLOTLY_FONT);
    var size = pick(get(layout, "font.size"), get(template, "font.size"), 12);
    var titleSize = pick(get(layout, "title.font.size"), get(template, "title.font.size"), Math.round(size * 1.4));
    var annotationSize = function (a) {
      return pick(get(a, "font.size"), get(template, "annotationdefaults.font.size"), size);
    };
    // plotly draws an axis title at 1.2 times the figure's font unless told otherwise
    var axisTitleSize = function (axis) {
      return pick(get(layout, axis + ".title.font.size"), get(template, axis.replace(/\d+$/, "") + ".title.font.size"),
                  Math.round(size * 1.2));
    };
    var margin = layout.margin = layout.margin || {};
    ["l", "r", "t", "b"].forEach(function (side) {
      margin[side] = pick(margin[side], get(template, "margin." + side), {l: 80, r: 80, t: 100, b: 80}[side]);
    });
    if (narrow) { margin.l = Math.min(margin.l, 52); margin.r = Math.min(margin.r, 16); }
    var height = pick(layout.height, 450);
    var plotH = height - pick(source.margin && source.margin.t, get(template, "margin.t"), 100)
      - pick(source.margin && source.margin.b, get(template, "margin.b"), 80);
    var plotW = width - margin.l - margin.r;
    var found = panels(layout);
    var annotations = layout.annotations = layout.annotations || [];
    var sliders = layout.sliders || [];
    var legendRight = layout.showlegend !== false && get(layout, "legend.orientation") !== "h";

    // panels side by side on a phone: one column, in reading order
    if (narrow && columns(found) > 1) {
      found.sort(function (a, b) { return (b.yd[1] - a.yd[1]) || (a.xd[0] - b.xd[0]); });
      var panelPx = Math.max(200, Math.min(260, plotH)), gapPx = 0, titled = [];
      // titles broken for a panel a third as wide are joined and broken again for the full width
      found.forEach(function (p, i) {
        titled[i] = annotations.filter(function (a) { return isPanelTitle(a, p); });
        titled[i].forEach(function (a) { a.text = wrap(unwrap(a.text), plotW - 8, annotationSize(a), family); });
        var xTitle = titleText(get(layout, p.x + ".title"));
        if (xTitle) setTitle(layout[p.x], "title", wrap(unwrap(xTitle), plotW - 8, axisTitleSize(p.x), family));
      });
      var gaps = found.map(function (p, i) {
        if (i === 0) return 0;
        var above = found[i - 1], xTitle = titleText(get(layout, above.x + ".title"));
        var shows = get(layout, above.x + ".showticklabels") !== false;
        var titleLines = titled[i].reduce(function (n, a) { return Math.max(n, lines(a.text)); }, 0);
        return (shows ? 26 : 6) + lines(xTitle) * axisTitleSize(above.x) * LINE
          + titleLines * annotationSize(titled[i][0] || {}) * LINE + 16 + (((extra && extra.gaps) || [])[i] || 0);
      });
      gapPx = gaps.reduce(function (s, g) { return s + g; }, 0);
      if (info) {
        info.stack = found.map(function (p, i) {
          return {x: p.x, y: p.y, titles: titled[i].map(function (a) { return annotations.indexOf(a); })};
        });
      }
      plotH = found.length * panelPx + gapPx;
      var top = plotH;
      found.forEach(function (p, i) {
        top -= gaps[i];
        var yd = [(top - panelPx) / plotH, top / plotH];
        top -= panelPx;
        titled[i].forEach(function (a) { a.x = 0.5; a.y = yd[1]; });
        layout[p.x].domain = [0, 1];
        layout[p.y] = layout[p.y] || {};
        layout[p.y].domain = yd;
        p.xd = [0, 1]; p.yd = yd;
      });
      Object.keys(layout).forEach(function (key) {  // an overlay follows the axis it overlays
        var axis = layout[key];
        if (/^[xy]axis\d*$/.test(key) && axis.overlaying && layout[axis.overlaying.replace(/^([xy])/, "$1axis")]) {
          axis.domain = layout[axis.overlaying.replace(/^([xy])/, "$1axis")].domain;
        }
      });
    }

    Object.keys(layout).forEach(function (key) {
      if (/^[xy]axis\d*$/.test(key) && layout[key].automargin === undefined) layout[key].automargin = true;
    });

    // axis titles of several lines: room for them in the margin they sit in
    found.forEach(function (p) {
      var xLines = lines(titleText(get(layout, p.x + ".title")));
      var yLines = lines(titleText(get(layout, p.y + ".title")));
      if (p.yd[0] < 0.001 && xLines > 1) margin.b = Math.max(margin.b, 30 + xLines * axisTitleSize(p.x) * LINE);
      if (p.xd[0] < 0.001 && yLines > 1) margin.l += (yLines - 1) * axisTitleSize(p.y) * LINE;
    });

    // an explorer's curves leave room in the window for its title and sliders
    if (sliders.length && windowHeight) {
      plotH = Math.min(plotH, Math.max(240, 0.92 * windowHeight - sliders.length * SLIDER_PX - 80));
    }

    // titles of panels and axes fit their panel
    found.forEach(function (p) {
      var panelW = (p.xd[1] - p.xd[0]) * plotW, panelH = (p.yd[1] - p.yd[0]) * plotH;
      var matched = get(layout, p.x + ".matches");
      var range = get(layout, p.x + ".range") || (matched && get(layout, matched.replace(/^x/, "xaxis") + ".range"))
        || (layout._xExtent || {})[p.x.replace("axis", "")];
      var onPanel = annotations.filter(function (a) {
        return a.xref === p.x.replace("axis", "") && a.yanchor === "bottom";
      });
      onPanel.forEach(function (a) {
        // labels of regions side by side: each as wide as the distance to its nearest neighbour at most
        var room = panelW / 3;
        if (range && range[1] !== range[0]) {
          onPanel.forEach(function (b) {
            if (b === a || b.y !== a.y) return;
            room = Math.min(room, Math.abs(b.x - a.x) / Math.abs(range[1] - range[0]) * panelW);
          });
        }
        if (narrow) { a.font = Object.assign({}, a.font, {size: Math.min(annotationSize(a), size - 2)}); }
        a.text = wrap(unwrap(a.text), Math.max(48, room - 8), annotationSize(a), family);
      });
      annotations.forEach(function (a) {
        if (isPanelTitle(a, p)) a.text = wrap(a.text, panelW - 8, annotationSize(a), family);
      });
      var xTitle = titleText(get(layout, p.x + ".title"));
      if (xTitle) setTitle(layout[p.x], "title", wrap(xTitle, panelW - 8, axisTitleSize(p.x), family));
      var yTitle = titleText(get(layout, p.y + ".title"));
      if (yTitle) setTitle(layout[p.y], "title", wrap(yTitle, Math.max(80, panelH - 8), axisTitleSize(p.y), family));
    });
    // tick labels given as text (a token under each position): every k-th one, level, when all do not fit side by side
    found.forEach(function (p) {
      var axis = layout[p.x], text = axis.ticktext, values = axis.tickvals;
      if (!Array.isArray(text) || !Array.isArray(values) || text.length !== values.length || !text.length) return;
      var tickSize = pick(get(axis, "tickfont.size"), size);
      var labelPx = text.reduce(function (w, t) {
        return Math.max(w, String(t).split(/<br\s*\/?>/i).reduce(function (v, line) {
          return Math.max(v, textPx(line, tickSize, family));
        }, 0));
      }, 0) + 8;
      var every = Math.ceil(text.length / Math.max(1, Math.floor((p.xd[1] - p.xd[0]) * plotW / labelPx)));
      axis.tickangle = 0;
      axis.tickvals = values.filter(function (v, i) { return i % every === 0; });
      axis.ticktext = text.filter(function (v, i) { return i % every === 0; });
    });

    // what sits on the top panels (their titles, labels of regions): the room it needs above the curves
    var aboveCurves = annotations.reduce(function (px, a) {
      var onTop = a.yanchor === "bottom" && a.yref === "paper" && a.y > 0.999;
      return onTop ? Math.max(px, lines(a.text) * annotationSize(a) * LINE + 6) : px;
    }, 0);

    // the figure's title: before the toolbar on a wide figure, within the width on a narrow one
    var title = titleText(layout.title), titleBlock = 10;
    if (title) {
      var titleX = pick(get(layout, "title.x"), get(template, "title.x"), 0.05);
      var toolbar = narrow ? 12 : TOOLBAR_PX;
      var anchor = pick(get(layout, "title.xanchor"), get(template, "title.xanchor"), "auto");
      var centred = anchor === "center" || (anchor === "auto" && titleX > 1 / 3 && titleX < 2 / 3);
      var room = centred ? 2 * Math.min(titleX * width, (1 - titleX) * width - toolbar)
        : width * (1 - titleX) - toolbar;
      var wrapped = wrap(title, room, titleSize, family);
      layout.title = typeof layout.title === "string" ? {text: wrapped} : layout.title;
      setTitle(layout, "title", wrapped);
      layout.title.y = 1; layout.title.yref = "container"; layout.title.yanchor = "top";
      layout.title.pad = {t: 16};
      titleBlock = 16 + lines(wrapped) * titleSize * LINE + 8;
    }
    margin.t = Math.max(margin.t, titleBlock + aboveCurves);

    // an explorer's sliders: under the title, above the curves (and what sits on them)
    if (sliders.length) {
      margin.t = titleBlock + sliders.length * SLIDER_PX + aboveCurves;
      sliders.forEach(function (s, k) {
        s.x = 0; s.len = 1; s.xanchor = "left"; s.yanchor = "top";
        s.y = 1 + (aboveCurves + (sliders.length - k) * SLIDER_PX) / plotH;
        s.pad = {t: 4, b: 4, l: 8, r: 8};
      });
    }

    // the legend: under the plot on a phone (and for every explorer), in rows that fit the width
    var entries = 0, widest = 0;
    var below = sliders.length || (narrow && legendRight) || get(layout, "legend.orientation") === "h";
    if (below && layout.showlegend !== false) {
      var names = (layout._legendNames || []);
      entries = names.length;
      widest = names.reduce(function (w, n) { return Math.max(w, textPx(n, size, family) + 44); }, 0);
      var perRow = Math.max(1, Math.floor(plotW / Math.max(widest, 1)));
      var rows = entries ? Math.ceil(entries / perRow) : 0;
      var bottomAxis = found.reduce(function (low, p) {
        return p.yd[0] < low.yd[0] ? p : low;
      }, found[0] || {yd: [0, 1]});
      var xTitleLines = bottomAxis.x ? lines(titleText(get(layout, bottomAxis.x + ".title"))) : 0;
      var offset = 26 + xTitleLines * (bottomAxis.x ? axisTitleSize(bottomAxis.x) : size) * LINE + 8
        + ((extra && extra.legend) || 0);
      layout.legend = layout.legend || {};
      if (narrow || sliders.length) {
        layout.legend.orientation = "h"; layout.legend.x = 0; layout.legend.xanchor = "left";
        layout.legend.yanchor = "top"; layout.legend.y = -offset / plotH;
        margin.b = offset + rows * size * 1.7 + 14;
      }
    }
    delete layout._legendNames;
    delete layout._xExtent;
    layout.height = Math.round(margin.t + plotH + margin.b);
    delete layout.width;
    layout.autosize = true;
    return layout;
  }

  function legendNames(data) {
    var seen = {}, names = [];
    data.forEach(function (t) {
      if (t.showlegend === false || !t.name) return;
      var key = t.legendgroup ? "group:" + t.legendgroup : "name:" + t.name;
      if (seen[key]) return;
      seen[key] = true; names.push(t.name);
    });
    return names;
  }

  // each x axis's data range (traces' numeric x), for an axis whose range plotly chooses itself
  function xExtents(data) {
    var extents = {};
    data.forEach(function (t) {
      var axis = t.xaxis || "x";
      (Array.isArray(t.x) ? t.x : []).forEach(function (v) {
        if (typeof v !== "number" || !isFinite(v)) return;
        var e = extents[axis] = extents[axis] || [v, v];
        e[0] = Math.min(e[0], v); e[1] = Math.max(e[1], v);
      });
    });
    return extents;
  }

  function laidOut(gd, data, layout) {
    var source = copy(layout);
    source._legendNames = legendNames(data);
    source._xExtent = xExtents(data);
    var width = gd.clientWidth || gd.parentElement.clientWidth;
    var info = {};
    var fitted = fit(source, width, window.innerHeight, gd._rlhfExtra, info);
    gd._rlhfStack = info.stack || null;
    if (width < NARROW_PX) {  // a legend entry longer than the width breaks into lines
      var template = get(layout, "template.layout") || {};
      var size = pick(get(layout, "legend.font.size"), get(layout, "font.size"), get(template, "font.size"), 12);
      var family = pick(get(layout, "font.family"), get(template, "font.family"), PLOTLY_FONT);
      data = data.map(function (t) {
        if (!t.name || t.showlegend === false) return t;
        return Object.assign({}, t, {name: wrap(t.name, width - 90, size, family)});
      });
    }
    gd.style.height = fitted.height + "px";
    var config = {displaylogo: false, responsive: true, displayModeBar: width < NARROW_PX ? false : "hover"};
    return {data: data, layout: fitted, config: config};
  }

  // a legend moved under the plot sits below the lowest tick label or axis title plotly drew (long or rotated
  // tick labels take more room than `fit` can know): measured once drawn, and moved down if they meet
  function settle(gd) {
    var done = gd._rlhfExtra || {};
    if (gd._rlhfStack && !done.gaps) {  // stacked panels: each title below the panel above's tick labels
      var extra = gd._rlhfStack.map(function (p, i) {
        if (i === 0) return 0;
        var above = gd._rlhfStack[i - 1], ax = above.x.replace("axis", ""), ay = above.y.replace("axis", "");
        var low = -Infinity, high = Infinity;
        var below = ".subplot." + ax + ay + " .xaxislayer-above text, .g-" + ax + "title text";
        gd.querySelectorAll(below).forEach(function (t) {
          var r = t.getBoundingClientRect();
          if (r.height > 0) low = Math.max(low, r.bottom);
        });
        p.titles.forEach(function (k) {
          var a = gd.querySelector(".annotation[data-index='" + k + "']");
          if (a && a.getBoundingClientRect().height > 0) high = Math.min(high, a.getBoundingClientRect().top);
        });
        return isFinite(low) && isFinite(high) && low + 6 > high ? Math.ceil(low + 6 - high) : 0;
      });
      if (extra.some(function (e) { return e > 0; })) {
        gd._rlhfExtra = {gaps: extra, legend: done.legend, legendPasses: done.legendPasses};
        return redraw(gd, gd._rlhfSource.data, gd._rlhfSource.layout);
      }
    }
    var layout = gd.layout, legend = gd.querySelector(".legend");
    if (!legend || !layout.legend || layout.legend.orientation !== "h" || !(layout.legend.y < 0)) return null;
    var svg = gd.querySelector(".main-svg").getBoundingClientRect();
    var plotBottom = svg.top + layout.margin.t + gd._fullLayout._size.h;
    var lowest = plotBottom;
    var xLabels = ".xaxislayer-above text, .g-xtitle text, [class^='g-x'][class$='title'] text";
    gd.querySelectorAll(xLabels).forEach(function (t) {
      var r = t.getBoundingClientRect();
      if (r.height > 0) lowest = Math.max(lowest, r.bottom);
    });
    var top = legend.getBoundingClientRect().top;
    if (top >= lowest + 4) return null;
    if ((done.legendPasses || 0) >= 2) return null;
    // kept for the next redraws (an explorer's slider): they are laid out with it at once
    gd._rlhfExtra = {gaps: done.gaps, legend: (done.legend || 0) + lowest + 8 - top,
                     legendPasses: (done.legendPasses || 0) + 1};
    return redraw(gd, gd._rlhfSource.data, gd._rlhfSource.layout);
  }

  // marks `gd` as laid out for its width (data-fitted, which tests wait for)
  function markFitted(gd) {
    return function () { gd.setAttribute("data-fitted", String(gd.clientWidth)); };
  }

  // draw `data` and `layout` in `gd` at its width; again when the window's width changes. Returns plotly's promise.
  function draw(gd, data, layout) {
    var drawn = laidOut(gd, data, layout);
    gd._rlhfSource = {data: data, layout: layout};
    var lastWidth = gd.clientWidth, pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(function () {
        if (gd.clientWidth === lastWidth) return;
        lastWidth = gd.clientWidth;
        gd._rlhfExtra = null;
        gd.removeAttribute("data-fitted");
        redraw(gd, gd._rlhfSource.data, gd._rlhfSource.layout);
      }, 150);
    });
    if (gd.classList.contains("rlhf-static-explorer")) watchExplorer(gd);
    var drawing = Plotly.newPlot(gd, drawn.data, drawn.layout, drawn.config);
    return drawing.then(function () { return settle(gd); }).then(markFitted(gd));
  }

  // the same figure with new data or layout (an explorer's slider moved), fitted again
  function redraw(gd, data, layout) {
    gd._rlhfSource = {data: data, layout: layout};
    var drawn = laidOut(gd, data, layout);
    var drawing = Plotly.react(gd, drawn.data, drawn.layout, drawn.config);
    return drawing.then(function () { return settle(gd); }).then(markFitted(gd));
  }

  // while an explorer is on screen the page's floating buttons (back to top) are hidden: they would sit on its
  // sliders (site.css, html.rlhf-explorer-in-view)
  var inView = [];
  var watcher = window.IntersectionObserver ? new IntersectionObserver(function (entries) {
    entries.forEach(function (entry) {
      inView = inView.filter(function (e) { return e !== entry.target; });
      if (entry.isIntersecting) inView.push(entry.target);
    });
    document.documentElement.classList.toggle("rlhf-explorer-in-view", inView.length > 0);
  }) : null;
  function watchExplorer(gd) { if (watcher) watcher.observe(gd); }

  window.rlhfFigures = {draw: draw, redraw: redraw, fit: fit, wrap: wrap, NARROW_PX: NARROW_PX};
})();
