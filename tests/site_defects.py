"""What a reader of the static site cannot see or use, counted in the browser
(tests/notebooks/test_site_browser.py).

Each constant is a JavaScript function of the page (no argument) that returns one line per defect,
so a test can assert that a page has none and say which they are:

- `CUT_FORMULAS`: a formula MathJax 3 typeset in the page's text, display or inline, reaching past
  the edge of a box that hides its overflow (before a box that scrolls), or past the window's right
  edge;
- `UNREACHABLE_TABLES`: a table wider than its column that no box scrolls sideways, or whose
  sideways scrollbar is below the window while the table's top is in it (the box is taller than the
  window: the reader has to scroll the page to the table's foot to find the bar);
- `FIGURE_DEFECTS`: a figure's label (title, subplot or axis title, legend, tick or slider label)
  reaching past the figure's edges, labels running into each other (`figure_overlaps.OVERLAPS`), the
  toolbar over the title or the legend;
- `EXPLORER_DEFECTS`: an explorer's slider (its rail, handle or step labels) outside the window's
  width, a slider and the curves it moves too far apart to be seen together in one window, a caption
  wider than its column, or a slider handle covered by something else on the page once the slider is
  scrolled to the top of the window.

Each rule allows `SLACK_PX` of overlap: glyph boxes include a little empty space around the letters.
"""

from __future__ import annotations

from figure_overlaps import OVERLAPS, SLACK_PX

#: what hides, scrolls or shows an element's sideways overflow (shared by the rules below)
_BOXES = """
    const hides = e => ['hidden', 'clip'].includes(getComputedStyle(e).overflowX);
    const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
    // the first box above `e` that hides or scrolls its sideways overflow, with what it does
    const clipper = e => {
        for (let a = e.parentElement; a && a !== document.documentElement; a = a.parentElement) {
            if (scrolls(a)) return {box: a, scrolls: true};
            if (hides(a)) return {box: a, scrolls: false};
        }
        return null;
    };
    const text = e => (e.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 50);
    // a typeset formula's TeX (MathJax 3 draws its characters with CSS, so its text is empty)
    const tex = m => ((window.MathJax && MathJax.startup && MathJax.startup.document
                       && MathJax.startup.document.getMathItemsWithin(m)[0]) || {}).math || text(m);
"""

CUT_FORMULAS = (f"""() => {{{_BOXES}
    const out = [];
    const view = window.innerWidth;
    document.querySelectorAll('article mjx-container').forEach((m, i) => {{
        const r = m.getBoundingClientRect();
        if (r.width === 0) return;
        const kind = m.getAttribute('display') === 'true' ? 'display' : 'inline';
        let e = m;
        for (let c = clipper(e); c; c = clipper(e)) {{
            const b = c.box.getBoundingClientRect();
            if (c.scrolls) return;  // reachable by scrolling that box
            if (r.left < b.left - SLACK || r.right > b.right + SLACK) {{
                out.push(kind + ' formula ' + i + ' cut by its box: ' + tex(m)); return;
            }}
            e = c.box;
        }}
"""
    "        if (r.right > view + SLACK || r.left < -SLACK)"
    " out.push(kind + ' formula ' + i + ' past the window: ' + tex(m));\n"
    f"""    }});
    return out;
}}""").replace("SLACK", str(SLACK_PX))

UNREACHABLE_TABLES = f"""() => {{{_BOXES}
    const out = [];
    const view = window.innerWidth, tall = window.innerHeight;
    document.querySelectorAll('article table').forEach((t, i) => {{
        const r = t.getBoundingClientRect();
        if (r.width === 0) return;
        let e = t;
        for (let c = clipper(e); c; c = clipper(e)) {{
            const b = c.box.getBoundingClientRect();
            const wider = r.width > c.box.clientWidth + SLACK;
            if (c.scrolls) {{
                if (wider && c.box.clientHeight > tall) {{
                    out.push('table ' + i + ': its sideways scrollbar is ' + Math.round(b.height)
                             + ' px below its top, more than the window: ' + text(t));
                }}
                return;
            }}
            if (r.left < b.left - SLACK || r.right > b.right + SLACK) {{
                out.push('table ' + i + ' cut by its box: ' + text(t)); return;
            }}
            e = c.box;
        }}
        if (r.right > view + SLACK) out.push('table ' + i + ' past the window: ' + text(t));
    }});
    return out;
}}""".replace("SLACK", str(SLACK_PX))

FIGURE_DEFECTS = (f"""() => {{
    const out = [];
    const overlaps = {OVERLAPS};
"""
    "    const figures = Array.from(document.querySelectorAll("
    "'.rlhf-site-figure, .rlhf-static-explorer'));\n"
    f"""    figures.forEach((gd, i) => {{
        const plot = gd.querySelector('.js-plotly-plot') || gd;
        const svg = plot.querySelector('.main-svg');
        if (!svg) {{ out.push('figure ' + i + ': not drawn'); return; }}
        const box = svg.getBoundingClientRect();
"""
    "        const name = 'figure ' + i + ' ('"
    " + ((plot.layout && plot.layout.title && plot.layout.title.text) || '')\n"
    "            .replace(/<[^>]+>/g, ' ').slice(0, 40) + ')';\n"
    "        const labels = plot.querySelectorAll("
    "'.gtitle, .annotation-text-g, .g-xtitle text, .g-ytitle text, '\n"
    "            + '[class^=\"g-x\"][class$=\"title\"] text,"
    " [class^=\"g-y\"][class$=\"title\"] text,"
    " .legend .bg, '\n"
    "            + '.xaxislayer-above text, .yaxislayer-above text, .slider-group text');\n"
    f"""        labels.forEach(l => {{
            const r = l.getBoundingClientRect();
            if (r.width === 0 || r.height === 0) return;
            if (r.left < box.left - SLACK || r.right > box.right + SLACK || r.top < box.top - SLACK
                || r.bottom > box.bottom + SLACK) {{
                const what = (l.textContent || 'legend').trim().slice(0, 40);
                out.push(name + ': label cut at the figure\\'s edge: "' + what + '"');
            }}
        }});
        overlaps(plot).forEach(o => out.push(name + ': ' + o));
        const bar = plot.querySelector('.modebar');
"""
    "        if (bar && getComputedStyle(plot.querySelector('.modebar-container') || bar).display"
    f" !== 'none') {{\n"
    f"""            const m = bar.getBoundingClientRect();
            plot.querySelectorAll('.gtitle, .legend .bg').forEach(l => {{
                const r = l.getBoundingClientRect();
                const w = Math.min(m.right, r.right) - Math.max(m.left, r.left);
                const h = Math.min(m.bottom, r.bottom) - Math.max(m.top, r.top);
                const what = (l.textContent || 'the legend').trim().slice(0, 40);
"""
    "                if (m.width > 0 && w > SLACK && h > SLACK)"
    " out.push(name + ': the toolbar covers \"' + what + '\"');\n"
    f"""            }});
        }}
    }});
    return out;
}}""").replace("SLACK", str(SLACK_PX))

#: the explorers' controls (an async function: it scrolls each slider to the middle of the window,
#: coming up from below as a reader does, which is when the theme shows its floating "Back to top"
#: button, and waits for the page to settle)
EXPLORER_DEFECTS = ("""async () => {
    const out = [];
    const view = window.innerWidth, tall = window.innerHeight;
"""
    "    const frames = () => new Promise(done =>"
    " requestAnimationFrame(() => requestAnimationFrame(done)));\n"
    """    const explorers = Array.from(document.querySelectorAll('.rlhf-static-explorer'));
    for (const [i, gd] of explorers.entries()) {
        const plot = gd.querySelector('.js-plotly-plot') || gd;
        for (const [k, s] of Array.from(plot.querySelectorAll('.slider-group')).entries()) {
            const name = 'explorer ' + i + ' slider ' + k;
"""
    "            s.querySelectorAll("
    "'.slider-rail-rect, .slider-grip-rect, .slider-label-group text').forEach(p => {\n"
    """                const r = p.getBoundingClientRect();
                if (r.width > 0 && (r.left < -SLACK || r.right > view + SLACK)) {
"""
    "                    out.push(name + ': ' + (p.textContent || p.getAttribute('class'))"
    " + ' outside the window');\n"
    """                }
            });
            const r = s.getBoundingClientRect();
            const curves = Array.from(plot.querySelectorAll('.cartesianlayer .bg, .nsewdrag'))
                .map(e => e.getBoundingClientRect()).filter(b => b.height > 0);
"""
    "            const far = Math.max(r.bottom, ...curves.map(b => b.bottom))"
    " - Math.min(r.top, ...curves.map(b => b.top));\n"
    "            if (far > tall)"
    " out.push(name + ': ' + Math.round(far) + ' px from the slider to the far side of the '\n"
    """                                     + 'curves, taller than the window (' + tall + ' px)');
            window.scrollBy(0, r.top + r.height / 2 - tall / 2 + 200);
            await frames();
            window.scrollBy(0, -200);
            await frames();
            s.querySelectorAll('.slider-grip-rect, .slider-label-group text').forEach(p => {
                const g = p.getBoundingClientRect();
                const x = g.left + g.width / 2, y = g.top + g.height / 2;
                if (x < 0 || x > view || y < 0 || y > tall) return;
                const hit = document.elementFromPoint(x, y);
"""
    "                if (hit && !gd.contains(hit))"
    " out.push(name + ': ' + (p.textContent || 'its handle') + ' covered by '\n"
    "                                                       + hit.tagName.toLowerCase()"
    " + '#' + hit.id);\n"
    """            });
        }
        const caption = gd.parentElement.querySelector('.rlhf-explorer-caption');
        if (caption) {
            const c = caption.getBoundingClientRect();
            if (caption.scrollWidth > caption.clientWidth + SLACK || c.right > view + SLACK) {
                out.push('explorer ' + i + ': its caption is wider than the window');
            }
        }
    }
    return out;
}""").replace("SLACK", str(SLACK_PX))
