"""`train_ppo --report-to`: the metrics of metrics.jsonl reach an experiment tracker (through
accelerate) under the glossary's TRL-style names, with the same values and steps; `none` writes no
tracking folder; a missing tracker package or an unknown name stops the run before any model is
built."""

from __future__ import annotations

import importlib.util
import json
import math
import os

import numpy as np
import pytest

# the quick_cli fixture (conftest: tiny overrides, runs folder in tmp_path, untrained reward
# adapter, one torch thread, a model build that fails) is requested by name
from test_train_cli import read_metrics, setup_error

from rlhf_helpers.ppo import tracking
from rlhf_helpers.ppo.metric_docs import METRICS

#: metrics.jsonl key -> the name TRL's PPOTrainer (the PPOv2 design) logs the same quantity under.
TRL_NAMES = {"kl": "objective/kl", "score": "objective/scores", "clipfrac": "policy/clipfrac_avg",
             "approx_kl": "policy/approxkl_avg", "policy_loss": "loss/policy_avg",
             "value_loss": "loss/value_avg",
             "vf_clipfrac": "val/clipfrac_avg", "entropy_update": "policy/entropy_avg"}


@pytest.fixture(scope="module")
def tensorboard_ready() -> None:
    """Skip when tensorboard is missing (it comes with the dev and tracking extras); on CI, fail."""
    if importlib.util.find_spec("tensorboard") is not None:
        return
    reason = "tensorboard is not installed (pip install 'rlhf-helpers[tracking]')"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the tracking test cannot run on CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def tiny_run(request, monkeypatch):
    """quick_cli with the real model build: its tmp_path."""
    from rlhf_helpers.ppo import build
    from rlhf_helpers.stages import train_ppo

    root = request.getfixturevalue("quick_cli")
    monkeypatch.setattr(train_ppo, "build_shared_model", build.build_shared_model)
    return root


def train(out, *flags: str, steps: int = 3) -> int:
    """In-process `main()` on the tiny profile with test_train_cli.TINY's overrides: `steps` PPO
    steps, an evaluation at step 2 (so some metrics exist at some steps only), no checkpoint; about
    a second a step."""
    from rlhf_helpers.stages import train_ppo

    return train_ppo.main(["--profile", "tiny", "--steps", str(steps), "--eval-every", "2",
                           "--save-every", "0", "--no-progress", "--output-dir", str(out), *flags])


def test_tensorboard_gets_every_metric_of_metrics_jsonl_by_its_grouped_name(
        tensorboard_ready, tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tiny_run / "ppo"
    assert train(out, "--report-to", "tensorboard") == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1.0, 2.0, 3.0]
    assert "eval_kl" in rows[1] and "eval_kl" not in rows[0]

    # what metrics.jsonl says, per tracker name: (step, value) in order; null in the file is a NaN
    # step
    expected: dict[str, list[tuple[int, float | None]]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step":
                expected.setdefault(tracking.TRACKER_NAMES[key],
                                    []).append((int(row["step"]), value))
    # and the run doctor's counts at the last step: steps per rule that fired, findings per severity
    from rlhf_helpers.doctor import diagnose
    from rlhf_helpers.stages.diagnose import tracker_values

    doctor = tracker_values(diagnose(out))
    assert {"doctor/errors", "doctor/warnings", "doctor/infos"} <= set(doctor)
    expected.update({name: [(3, value)] for name, value in doctor.items()})

    events = EventAccumulator(str(out / tracking.TRACKING_DIR / tracking.PROJECT),
                              size_guidance={"scalars": 0})
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(expected)  # every metric, and nothing else
    for name, points in expected.items():
        logged = events.Scalars(name)
        assert [e.step for e in logged] == [step for step, _ in points], name
        for event, (step, value) in zip(logged, points, strict=True):
            if value is None:
                assert math.isnan(event.value), (name, step)
                continue
            # an event file stores a float32: the logged value is exactly the JSON value cast to
            # float32
            assert np.float32(event.value) == np.float32(value), (name, step, event.value, value)
    # the run's settings went along as the run's config (accelerate's hparams.yml beside the events)
    hparams = list((out / tracking.TRACKING_DIR / tracking.PROJECT).glob("*/hparams.yml"))
    assert len(hparams) == 1 and "ppo_config/rollout_batch_size: 8" in hparams[0].read_text()


def test_report_to_none_writes_no_tracking_folder(tiny_run):
    out = tiny_run / "ppo"
    assert train(out, steps=1) == 0  # --report-to's default is none
    assert (out / "metrics.jsonl").is_file() and (out / "curves.html").is_file()
    assert not (out / tracking.TRACKING_DIR).exists()


@pytest.mark.usefixtures("quick_cli")
@pytest.mark.parametrize("name", ["tensorboard", "trackio", "wandb"])
def test_a_missing_tracker_package_exits_2_naming_it_before_any_work(tmp_path, capsys,
                                                                     monkeypatch, name):
    monkeypatch.setattr(tracking, "tracker_available", lambda package: False)
    out = tmp_path / "ppo"
    line = setup_error(["--report-to", name, "--output-dir", str(out)], capsys)
    assert line == (
        f"python -m rlhf_helpers.stages.train_ppo: error: --report-to {name}: the {name} package "
        f"is not installed; install it with `{tracking.INSTALL[name]}`, or leave --report-to out")
    assert not out.exists()  # found before the output folder, the reward model or the model


def test_the_tracking_extra_is_what_the_message_names():
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    assert tracking.INSTALL["tensorboard"] == f"pip install '{project['name']}[tracking]'"
    extra = project["optional-dependencies"]["tracking"]
    assert [req.split(">")[0] for req in extra] == ["tensorboard"]
    assert any(req.startswith("tensorboard>") for req in project["optional-dependencies"]["dev"])
    assert not any("tensorboard" in req
                   for req in project["dependencies"] + project["optional-dependencies"][
        "notebooks"])  # the default install does not grow


@pytest.mark.usefixtures("quick_cli")
def test_an_unknown_tracker_is_an_argparse_error(tmp_path, capsys):
    line = setup_error(["--report-to", "mlflow", "--output-dir", str(tmp_path / "ppo")], capsys)
    assert "argument --report-to: invalid choice: 'mlflow'" in line
    assert "'none', 'tensorboard', 'trackio', 'wandb'" in line


# ---------------------------------------------------------------- the names: the glossary is their
# one source
def test_every_metrics_jsonl_key_has_one_grouped_tracker_name():
    per_minibatch = {name for name, (group, _doc) in METRICS.items() if group == "minibatch"}
    assert set(tracking.TRACKER_NAMES) == set(METRICS) - per_minibatch - {"step"}
    names = list(tracking.TRACKER_NAMES.values())
    assert len(set(names)) == len(names), "two metrics share a tracker name"
    groups = {name.split("/")[0] for name in names}
    assert all(name.count("/") == 1 for name in names)
    assert groups == {"objective", "completions", "policy", "val", "loss", "eval", "time"}
    for key, trl_name in TRL_NAMES.items():
        assert tracking.TRACKER_NAMES[key] == trl_name, key


def test_tracker_values_renames_and_leaves_the_step_as_the_x_axis():
    values = tracking.tracker_values({"step": 4.0, "kl": 1.5, "clipfrac": 0.25, "eval_kl": 2.0})
    assert values == {"objective/kl": 1.5, "policy/clipfrac_avg": 0.25, "eval/kl": 2.0}


def test_flat_config_gives_trackers_one_level_of_plain_values():
    flat = tracking.flat_config({"profile": {"name": "tiny", "sizes": {"d": 2}}, "ppo_config": {
        "lora": {"target_modules": ["c_attn", "c_fc"]}, "target_kl": None, "whiten": True},
                                 "num_processes": 1})
    assert flat == {"profile/name": "tiny", "profile/sizes/d": 2, "num_processes": 1,
                    "ppo_config/target_kl": None,
                    "ppo_config/lora/target_modules": json.dumps(["c_attn", "c_fc"]),
                    "ppo_config/whiten": True}


class FakeAccelerator:
    """Records init_trackers' arguments (wandb itself need not be installed)."""

    def init_trackers(self, project_name, config=None, init_kwargs=None):
        self.project_name, self.config, self.init_kwargs = project_name, config, init_kwargs


@pytest.mark.parametrize("mode", [None, "online"])
def test_wandb_runs_offline_into_the_run_folder_unless_wandb_mode_is_set(tmp_path,
                                                                         monkeypatch, mode):
    if mode is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", mode)
    accelerator, out = FakeAccelerator(), tmp_path / "ppo-tiny"
    tracking.start_tracking(accelerator, "wandb", out, {"ppo_config": {"kl_coef": 0.2}})
    assert (accelerator.project_name == tracking.PROJECT
            and accelerator.config == {"ppo_config/kl_coef": 0.2})
    assert accelerator.init_kwargs == {"wandb": {"name": "ppo-tiny", "dir": str(out / "tracking"),
                                                 "mode": mode or "offline"}}
    assert (out / "tracking").is_dir()


def test_the_generated_docs_name_the_folders_the_code_uses():
    from tool_scripts import load_tool

    doc = load_tool("write_docs").metrics_markdown()
    assert (f"`<output-dir>/{tracking.TRACKING_DIR}/`" in doc
            and f"--project {tracking.PROJECT}`" in doc)
    assert tracking.INSTALL["tensorboard"] in doc


@pytest.mark.usefixtures("quick_cli")
def test_a_tracking_path_that_is_a_file_or_read_only_exits_2_before_any_model(tmp_path,
                                                                              capsys, monkeypatch):
    monkeypatch.setattr(tracking, "tracker_available", lambda package: True)
    out = tmp_path / "ppo"
    out.mkdir()
    (out / tracking.TRACKING_DIR).write_text("my notes")
    line = setup_error(["--report-to", "tensorboard", "--output-dir", str(out)], capsys)
    assert line.endswith(
        f"--report-to tensorboard: {out / tracking.TRACKING_DIR} is a file; the tracker writes a "
        "folder there (move the file, or choose another --output-dir)")
    (out / tracking.TRACKING_DIR).unlink()
    (out / tracking.TRACKING_DIR).mkdir()
    # what a read-only folder answers
    monkeypatch.setattr(tracking.os, "access", lambda path, mode: False)
    line = setup_error(["--report-to", "tensorboard", "--output-dir", str(out)], capsys)
    assert line.endswith(f"{out / tracking.TRACKING_DIR} is not writable (its permissions); fix "
                         "them, or choose another --output-dir")
