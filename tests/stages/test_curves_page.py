"""The training command's curves.html (`stages.curves_page`, `metrics.write_curves`): the course's
figure style, a title naming the run, the run doctor's findings marked as notebook 05 marks them,
plotly.js inlined; and the command writes it once the doctor's verdict is known."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import plotly.io as pio
import pytest
import torch
from test_diagnosis import FACTS, SIGNATURES, broken, healthy

from rlhf_helpers.doctor import diagnose
from rlhf_helpers.ppo.metrics import DEFAULT_CURVES, write_curves
from rlhf_helpers.runtime.figure_template import FIGURE_FONT, course_template
from rlhf_helpers.stages.curves_page import run_curves_figure, run_title, write_run_curves

RECORDED_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-runs" / "h200-2026-11-27-cli"


def page_figure(page: str) -> dict[str, Any]:
    """{"data", "layout"} of the one plotly figure a page draws, read from its Plotly.newPlot
    call."""
    call = page.index("Plotly.newPlot(")
    start = page.index("[", call)  # the data list, after the div's id
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(page, start)
    layout, _ = decoder.raw_decode(page, page.index("{", end))
    return {"data": data, "layout": layout}


def marks(figure: dict[str, Any]) -> list[dict[str, Any]]:
    """The doctor's crosses: the traces drawn as markers of symbol x."""
    return [trace for trace in figure["data"] if trace.get("marker", {}).get("symbol") == "x"]


def panel_of(figure: dict[str, Any], trace: dict[str, Any]) -> str:
    """The subplot title of the panel a trace is drawn on (make_subplots centres it above the
    panel)."""
    layout = figure["layout"]
    x_domain = layout["xaxis" + trace.get("xaxis", "x")[1:]]["domain"]
    y_top = layout["yaxis" + trace.get("yaxis", "y")[1:]]["domain"][1]
    (title,) = [
        note["text"]
        for note in layout["annotations"]
        if x_domain[0] <= note["x"] <= x_domain[1] and math.isclose(note["y"], y_top)
    ]
    return title


def test_a_failing_runs_curves_mark_each_finding_on_the_curve_its_rule_reads(tmp_path):
    """The first minibatch's ratio off 1 at every step (an error) and the entropy collapsed (a
    warning): crosses on first_ratio, a panel the default curves lack, and on entropy, at the steps
    the doctor names."""
    ratio_off, collapse = SIGNATURES["first_ratio_not_one"][1], SIGNATURES["collapse"][1]
    rows = broken(lambda row, index: (ratio_off(row, index), collapse(row, index)))
    diagnosis = diagnose(rows, facts=FACTS)
    found = {f.rule: f for f in diagnosis.findings}
    assert {found["first_ratio_not_one"].severity,
            found["collapse"].severity} == {"error", "warning"}
    path = tmp_path / "ppo-broken" / "curves.html"
    path.parent.mkdir()
    write_run_curves(rows, path, "tiny", diagnosis)
    figure = page_figure(path.read_text())
    crosses = {(panel_of(figure, trace), trace["marker"]["color"]): trace["x"]
               for trace in marks(figure)}
    assert crosses[("first_ratio", "crimson")] == list(found["first_ratio_not_one"].steps)
    entropy_marks = {panel: steps for (panel, color),
                     steps in crosses.items() if color == "darkorange"}
    assert entropy_marks["entropy"] == list(found["collapse"].steps)
    title = figure["layout"]["title"]["text"]
    assert title.startswith("PPO run ppo-broken: tiny profile, 30 steps<br>")
    assert ("run doctor: error first_ratio_not_one" in title
            and "run doctor: warning collapse" in title)


def test_a_healthy_runs_curves_have_no_mark_and_say_the_doctor_found_nothing(tmp_path):
    rows = healthy()
    diagnosis = diagnose(rows, facts=FACTS)
    assert diagnosis.findings == []
    path = tmp_path / "ppo-healthy" / "curves.html"
    path.parent.mkdir()
    write_run_curves(rows, path, "tiny", diagnosis)
    figure = page_figure(path.read_text())
    assert marks(figure) == []
    assert (
        figure["layout"]["title"]["text"]
        == "PPO run ppo-healthy: tiny profile, 30 steps<br><sup>run doctor: no finding</sup>"
    )
    # no extra panel
    assert [note["text"] for note in figure["layout"]["annotations"]] == list(DEFAULT_CURVES)


def test_a_recorded_gpu_runs_page_names_it_and_opens_offline_in_the_course_style(tmp_path):
    """The H200 run's own metrics.jsonl and diagnosis: the tab and the figure are titled with the
    run, the page carries plotly.js (no script from the network) and the course template (white
    plot, the course's font)."""
    rows = [json.loads(line) for line in (RECORDED_RUN / "metrics.jsonl").read_text().splitlines()]
    diagnosis = diagnose(RECORDED_RUN)
    (tmp_path / RECORDED_RUN.name).mkdir()
    path = tmp_path / RECORDED_RUN.name / "curves.html"
    write_run_curves(rows, path, "gpu", diagnosis)
    page = path.read_text()
    title = "PPO run h200-2026-11-27-cli: gpu profile, 20 steps"
    assert f"<title>{title}</title>" in page and 'name="viewport"' in page
    assert not re.search(r"<script[^>]+src=", page) and "plotly.js v" in page  # plotly.js inlined
    layout = page_figure(page)["layout"]
    assert layout["title"]["text"].startswith(title + "<br><sup>run doctor: info untrained_critic")
    template = layout["template"]["layout"]
    assert (
        template["plot_bgcolor"] == "white"
        and template["font"]["size"] == FIGURE_FONT["size"]
        and template["title"]["x"] < 0.1
    )
    # no partial file left beside it
    assert not [p for p in path.parent.iterdir() if p.name != "curves.html"]


def test_a_plain_curves_page_is_in_the_course_style_too(tmp_path):
    """`write_curves` without a figure of its own: the course's template, not plotly's grey
    default."""
    write_curves(healthy(3), tmp_path / "curves.html")
    page = (tmp_path / "curves.html").read_text()
    template = page_figure(page)["layout"]["template"]["layout"]
    assert template["plot_bgcolor"] == "white" and template["font"]["size"] == FIGURE_FONT["size"]
    assert "<title>PPO training curves</title>" in page


def test_the_template_is_the_one_the_notebooks_use():
    """One course style: the template curves.html carries is the one `use_course_figure_style` makes
    the default."""
    from rlhf_helpers.widgets.style import COURSE_TEMPLATE, use_course_figure_style

    before = pio.templates.default
    try:
        use_course_figure_style()
        assert pio.templates[COURSE_TEMPLATE].to_plotly_json() == course_template().to_plotly_json()
    finally:
        pio.templates.default = before


@pytest.mark.parametrize(
    ("status", "steps", "ending"),
    [
        ("finished", 1, "1 step"),
        ("stopped", 2, "2 steps, stopped by a NaN/inf"),
        ("write failed", 3, "3 steps, stopped: a run file could not be written"),
    ],
)
def test_the_title_says_how_many_steps_ran_and_how_the_run_ended(status, steps, ending):
    assert run_title("ppo-x", "tiny", healthy(steps),
                     status) == f"PPO run ppo-x: tiny profile, {ending}"


def test_a_finding_on_a_metric_the_run_never_logged_adds_no_panel():
    rows = broken(SIGNATURES["first_ratio_not_one"][1])
    diagnosis = diagnose(rows, facts=FACTS)
    for row in rows:
        row.pop("first_ratio")
    fig = run_curves_figure(rows, "t", diagnosis)
    assert [note.text
            for note in fig.layout.annotations][: len(DEFAULT_CURVES)] == list(DEFAULT_CURVES)
    assert "first_ratio" not in [note.text for note in fig.layout.annotations]


# ---------------------------------------------------------------- the training command
class RecordedTrainer:
    """Stands in for PPOTrainer in `train_ppo`: "trains" by logging a history with the entropy
    collapsed, so the command's end (the doctor, diagnosis.json, curves.html) runs on known numbers
    in a second."""

    def __init__(self, config: Any, model: Any, tokenizer: Any, prompts: Any,
                 **kwargs: Any) -> None:
        self.config, self.history, self.step_count, self.last_checkpoint = config, [], 0, None
        self.model = SimpleNamespace(compute_dtype=torch.float32)

    def train(self, eval_prompts: Any = None, callback: Any = None) -> list[dict[str, float]]:
        for row in broken(SIGNATURES["collapse"][1], steps=self.config.total_steps):
            self.history.append(row)
            self.step_count = int(row["step"])
            callback(row)
        return self.history

    def close(self) -> None:
        pass


def test_the_command_writes_curves_marked_with_the_verdict_it_wrote(quick_cli, monkeypatch, capsys):
    from rlhf_helpers.stages import train_ppo

    monkeypatch.setattr(train_ppo, "build_shared_model", lambda *args,
                        **kwargs: (torch.nn.Linear(1, 1), None))
    monkeypatch.setattr(train_ppo, "PPOTrainer", RecordedTrainer)
    # replayed
    monkeypatch.setattr(train_ppo, "train_loop", lambda trainer, **kwargs: trainer.train(**kwargs))
    out = quick_cli / "ppo-collapse"
    assert train_ppo.main(
        ["--profile", "tiny", "--steps", "12", "--no-progress", "--output-dir", str(out)]) == 0
    verdict = json.loads((out / "diagnosis.json").read_text())
    collapse = next(f for f in verdict["findings"] if f["rule"] == "collapse")
    figure = page_figure((out / "curves.html").read_text())
    assert figure["layout"]["title"]["text"].startswith(
        "PPO run ppo-collapse: tiny profile, 12 steps<br>")
    entropy = [trace["x"] for trace in marks(figure) if panel_of(figure, trace) == "entropy"]
    assert entropy == [collapse["steps"]]
    assert "collapse" in capsys.readouterr().err  # the same verdict, printed


def test_a_diagnosis_that_cannot_be_written_still_leaves_the_curves(quick_cli, monkeypatch, capsys):
    """diagnosis.json and curves.html are written each on its own: a disk error on one leaves the
    other."""
    from rlhf_helpers.stages import diagnose, train_ppo

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_ppo, "build_shared_model", lambda *args,
                        **kwargs: (torch.nn.Linear(1, 1), None))
    monkeypatch.setattr(train_ppo, "PPOTrainer", RecordedTrainer)
    # replayed
    monkeypatch.setattr(train_ppo, "train_loop", lambda trainer, **kwargs: trainer.train(**kwargs))
    monkeypatch.setattr(diagnose, "write_diagnosis", refuse)
    out = quick_cli / "ppo-no-diagnosis"
    train_ppo.main(
        ["--profile", "tiny", "--steps", "12", "--no-progress", "--output-dir", str(out)])
    assert not (out / "diagnosis.json").exists()
    figure = page_figure((out / "curves.html").read_text())
    assert marks(figure), "the curves still carry the doctor's marks"
    assert f"could not write diagnosis.json in {out}" in capsys.readouterr().err
