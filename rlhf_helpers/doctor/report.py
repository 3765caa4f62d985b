"""How the run doctor's findings are shown: as text (`format_findings`, what the training command
prints at the end of a run and `python -m rlhf_helpers.stages.diagnose` prints), and on a run's
curves (`mark_findings`: crosses at the steps of each error or warning, on the curves its rule
reads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rlhf_helpers.core.printed import wrap_printed
from rlhf_helpers.doctor.diagnosis import Diagnosis
from rlhf_helpers.doctor.findings import SEVERITIES
from rlhf_helpers.doctor.rules import rule_reads


def format_findings(diagnosis: Diagnosis, min_severity: str = "info") -> str:
    """The findings as text, one block each (what `train_ppo` prints at the end of a run), each
    finding's lines wrapped at their spaces within `PRINT_WIDTH`. The first line and the notes stay
    whole: they name a file, and a path cannot be wrapped."""
    if min_severity not in SEVERITIES:
        raise ValueError(f"min_severity must be one of {SEVERITIES}, got {min_severity!r}")
    shown = [f for f in diagnosis.findings
             if SEVERITIES.index(f.severity) <= SEVERITIES.index(min_severity)]
    where = f" from {diagnosis.source_file}" if diagnosis.source_file else ""
    read = f"{diagnosis.steps} steps read" + where
    notes = [f"    note: {note}" for note in diagnosis.notes]
    if not shown:
        return "\n".join([f"run doctor: {read}, no finding" + (
            "" if min_severity == "info" else f" at {min_severity} or above"), *notes])
    lines = [f"run doctor: {read}, {len(shown)} finding(s)", *notes]
    for finding in shown:
        lines.append(wrap_printed(finding.text()))
    return "\n".join(lines)


#: marker colour of a finding's steps on the curves, by severity (info findings are listed, not
#: marked)
MARK_COLORS = {"error": "crimson", "warning": "darkorange"}


def mark_findings(fig: Any, history: Sequence[Mapping[str, Any]], diagnosis: Diagnosis,
                  keys: Sequence[str], columns: int = 3) -> Any:
    """Show the doctor's findings on a `metrics.plot_curves` figure of `history` drawn with `keys`
    and `columns`: crosses at the steps of each error (red) or warning (orange) on the panels of the
    metrics its rule reads, and every finding listed under the title. Returns the figure."""
    reads = rule_reads()
    for finding in diagnosis.findings:
        if finding.severity not in MARK_COLORS:
            continue
        steps = set(finding.steps)  # a set: a finding may hold every step of a long run
        for index, key in enumerate(keys):
            if key not in reads.get(finding.rule, ()):
                continue
            points = [(row["step"], row[key]) for row in history if int(row.get("step", 0)) in steps
                      and isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
            fig.add_scatter(
                x=[x for x, _ in points], y=[y for _, y in points], mode="markers",
                showlegend=False,
                marker={"symbol": "x", "size": 9, "color": MARK_COLORS[finding.severity]},
                hovertemplate=f"step %{{x}}: {finding.rule} ({finding.severity})<extra></extra>",
                row=index // columns + 1, col=index % columns + 1)
    # one line per finding, so a long list never runs past the figure's width
    listed = [f"{f.severity} {f.rule} ({f.where()})" for f in diagnosis.findings] or ["no finding"]
    lines = "".join(f"<br><sup>run doctor: {line}</sup>" for line in listed)
    top = fig.layout.margin.t or 80
    fig.update_layout(title_text=f"{fig.layout.title.text or ''}{lines}",
                      margin_t=top + 18 * len(listed))
    return fig
