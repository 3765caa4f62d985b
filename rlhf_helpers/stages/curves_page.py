"""The training command's curves.html: the run's curves in the course's figure style, titled with
the run, with the run doctor's findings marked on them as notebook 05's live figure marks them
(`doctor.mark_findings`).

    diagnosis = diagnose(trainer)
    write_run_curves(trainer.history, Path("runs/ppo-tiny/curves.html"), "tiny", diagnosis)
    # title "PPO run ppo-tiny: tiny profile, 60 steps", then one "run doctor: ..." line per finding

The panels are `metrics.DEFAULT_CURVES`, then each metric an error or warning reads that they lack
(first_ratio, eos_in_mask...), so every finding that names steps gets its crosses on a curve; info
findings are listed only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.doctor.diagnosis import Diagnosis
from rlhf_helpers.doctor.report import MARK_COLORS, mark_findings
from rlhf_helpers.doctor.rules import rule_reads
from rlhf_helpers.ppo.metrics import default_keys, plot_curves, write_curves
from rlhf_helpers.runtime.figure_template import course_template

#: panels per row, as in notebook 05's live figure
CURVES_FILE = "curves.html"  #: the page's name in a run folder
COLUMNS = 3
#: how a run that did not finish ends, in its title (the training command's status names)
ENDINGS = {"stopped": "stopped by a NaN/inf",
           "write failed": "stopped: a run file could not be written"}


def run_title(run_name: str, profile: str, history: Sequence[Mapping[str, Any]],
              status: str = "finished") -> str:
    """The title of a run's curves: "PPO run NAME: PROFILE profile, N steps" (N: the last step
    logged), with how the run ended unless it finished."""
    steps = int(history[-1].get("step", len(history))) if history else 0
    title = f"PPO run {run_name}: {profile} profile, {steps} step{'' if steps == 1 else 's'}"
    return title if status == "finished" else f"{title}, {ENDINGS.get(status, status)}"


def flagged_metrics(history: Sequence[Mapping[str, Any]], diagnosis: Diagnosis) -> list[str]:
    """Metrics an error or warning of `diagnosis` reads that `history` has finite, in rule order."""
    reads = rule_reads()
    logged = {
        key for row in history for key, value in row.items()
        if isinstance(value, (int, float)) and math.isfinite(value)
    }
    found: list[str] = []
    for finding in diagnosis.findings:
        if finding.severity in MARK_COLORS:
            found += [key for key in reads.get(finding.rule, ())
                      if key in logged and key not in found]
    return found


def run_curves_figure(history: Sequence[Mapping[str, Any]], title: str,
                      diagnosis: Diagnosis | None = None) -> Any:
    """The curves of `history` in the course's template under `title`; with a `diagnosis`, its
    findings marked on the curves their rules read and listed under the title ("run doctor: no
    finding" for a clean run)."""
    keys = default_keys(history)
    if diagnosis is not None:
        keys += [key for key in flagged_metrics(history, diagnosis) if key not in keys]
    fig = plot_curves(history, keys=keys, columns=COLUMNS, title=title)
    fig.update_layout(template=course_template())
    return fig if diagnosis is None else mark_findings(fig, history, diagnosis, keys, COLUMNS)


def write_run_curves(
    history: Sequence[Mapping[str, Any]],
    path: Path,
    profile: str,
    diagnosis: Diagnosis | None,
    status: str = "finished",
) -> None:
    """curves.html at `path` in a run folder: `run_curves_figure` titled with the folder's name,
    `profile`, the steps logged and how the run ended, written by `metrics.write_curves` (atomic,
    plotly.js inlined). Nothing for an empty history."""
    if not history:
        return
    title = run_title(Path(path).absolute().parent.name, profile, history, status)
    write_curves(history, Path(path), run_curves_figure(history, title, diagnosis),
                 page_title=title)
