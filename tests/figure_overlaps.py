"""The labels of a drawn plotly figure that run into each other, as a learner sees them (browser
tests).

`OVERLAPS` is a JavaScript function of a plotly graph div. It returns one line for each pair of
label boxes that overlap by more than `SLACK_PX` in both directions, among:

- the legend against tick labels, axis titles, subplot titles, the figure title and slider labels;
- subplot titles against each other, against axis titles, against the figure title and against tick
  labels;
- axis titles against each other (two panels' x titles side by side);
- the figure title against slider labels.

Text boxes of one group are not compared within the group, except subplot titles and axis titles.
"""

from __future__ import annotations

#: px of overlap tolerated in each direction: glyph boxes include a little empty space around the
#: letters
SLACK_PX = 2

OVERLAPS = ("""gd => {
    const boxes = sel => Array.from(new Set(gd.querySelectorAll(sel)))
        .map(e => ({e, r: e.getBoundingClientRect(), t: (e.textContent || '').trim().slice(0, 30)}))
        .filter(x => x.r.width > 0 && x.r.height > 0);
    const groups = {
        legend: boxes('.legend .bg'),
        title: boxes('.gtitle'),
        subtitle: boxes('.annotation-text-g'),
        axistitle: boxes('.g-xtitle text, .g-ytitle text, [class^="g-x"][class$="title"] text, '
                         + '[class^="g-y"][class$="title"] text'),
        tick: boxes('.xaxislayer-above text, .yaxislayer-above text'),
        slider: boxes('.slider-group text, .updatemenu-container text'),
    };
"""
    "    const rules = [['legend', 'tick'], ['legend', 'axistitle'], ['legend', 'subtitle'],"
    " ['legend', 'title'],\n"
    "                   ['legend', 'slider'], ['subtitle', 'subtitle'], ['subtitle', 'axistitle'],"
    " ['subtitle', 'title'],\n"
    "                   ['subtitle', 'tick'], ['axistitle', 'axistitle'], ['title', 'slider']];\n"
    """    const out = new Set();
    for (const [a, b] of rules) for (const x of groups[a]) for (const y of groups[b]) {
        if (x.e === y.e || x.e.contains(y.e) || y.e.contains(x.e)) continue;
        const w = Math.min(x.r.right, y.r.right) - Math.max(x.r.left, y.r.left);
        const h = Math.min(x.r.bottom, y.r.bottom) - Math.max(x.r.top, y.r.top);
        if (w > SLACK && h > SLACK) {
            const pair = [`${a} "${x.t}"`, `${b} "${y.t}"`].sort().join(' x ');
            out.add(`${pair} (${Math.round(w)} x ${Math.round(h)} px)`);
        }
    }
    return Array.from(out);
}""").replace("SLACK", str(SLACK_PX))
