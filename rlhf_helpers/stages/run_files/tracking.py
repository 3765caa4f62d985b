"""Experiment tracking for the PPO command (`--report-to`), through accelerate's tracking API.

    python -m rlhf_helpers.stages.train_ppo --profile tiny --report-to tensorboard
    tensorboard --logdir runs/ppo-tiny/tracking

    check_tracker("wandb")                          # SetupError (exit 2) if wandb is not installed
    accelerator = make_accelerator("tensorboard", output_dir, cpu=True)
    start_tracking(accelerator, "tensorboard", output_dir, run_record)
    log_metrics(accelerator, trainer.history[-1])   # objective/kl, policy/clipfrac_avg... at a step
    accelerator.end_training()                      # closes the trackers

`--report-to none` (the default) builds a plain `Accelerator` and writes no tracking folder:
metrics.jsonl and curves.html are the run's record either way. Otherwise
`Accelerator(log_with=..., project_dir=<output-dir>/tracking)`,
`init_trackers(PROJECT, config=<run.json, flattened>)`, then `accelerator.log` per PPO step, under
the tracker names of `ppo.metric_docs.METRICS` (TRL's grouping); accelerate runs all of it on the
main process only. Where each tracker writes, with no account needed:

- tensorboard: events in <output-dir>/tracking/rlhf-ppo/ (`pip install 'rlhf-helpers[tracking]'`);
- wandb: offline, into <output-dir>/tracking/wandb/, unless $WANDB_MODE says otherwise
  (`wandb sync` uploads);
- trackio: its local store (~/.cache/huggingface/trackio; `trackio show --project rlhf-ppo`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.metric_docs import METRICS
from rlhf_helpers.stages.run_files.run_folder import SetupError

#: --report-to choices; "none" is the default.
REPORT_TO = ("none", "tensorboard", "trackio", "wandb")
#: Folder in --output-dir that accelerate gets as project_dir (tensorboard's events, wandb's run).
TRACKING_DIR = "tracking"
#: accelerate's project_name: the W&B / trackio project, tensorboard's sub-folder of TRACKING_DIR.
PROJECT = "rlhf-ppo"
#: tracker -> how to install its package (tensorboard comes with the package's `tracking` extra).
INSTALL = {"tensorboard": "pip install 'rlhf-helpers[tracking]'", "trackio": "pip install trackio",
           "wandb": "pip install wandb"}
#: metrics.jsonl key -> the name trackers get (the glossary's; the step is the x axis, not a value).
TRACKER_NAMES: dict[str, str] = {name: doc.tracker
                                 for name, (_group, doc) in METRICS.items() if doc.tracker}


def tracker_available(name: str) -> bool:
    """Whether the tracker's package can be imported (the package has the tracker's name)."""
    return importlib.util.find_spec(name) is not None


def check_tracker(report_to: str, output_dir: Path | None = None) -> None:
    """SetupError naming the package and how to install it, when --report-to names one that is
    missing; and, given the run's folder, when its tracking/ path is a file or a folder this process
    cannot write to (found before any model is built, not by the tracker after it)."""
    if report_to == "none":
        return
    if not tracker_available(report_to):
        raise SetupError(f"--report-to {report_to}: the {report_to} package is not installed; "
                         f"install it with `{INSTALL[report_to]}`, or leave --report-to out")
    tracking = None if output_dir is None else output_dir / TRACKING_DIR
    if tracking is not None and tracking.exists() and not tracking.is_dir():
        raise SetupError(f"--report-to {report_to}: {tracking} is a file; the tracker writes a "
                         "folder there (move the file, or choose another --output-dir)")
    if tracking is not None and tracking.is_dir() and not os.access(tracking, os.W_OK | os.X_OK):
        raise SetupError(f"--report-to {report_to}: {tracking} is not writable (its permissions); "
                         "fix them, or choose another --output-dir")


def make_accelerator(report_to: str, output_dir: Path, cpu: bool) -> Any:
    """The run's `accelerate.Accelerator`, with the tracker of --report-to (none: a plain one)."""
    # accelerate: only for a training run, which may be multi-process
    from accelerate import Accelerator

    if report_to == "none":
        return Accelerator(cpu=cpu)
    accelerator = Accelerator(cpu=cpu, log_with=report_to,
                              project_dir=str(output_dir / TRACKING_DIR))
    if not accelerator.log_with:  # accelerate drops a tracker it cannot import (a debug message)
        raise SetupError(f"--report-to {report_to}: accelerate found no usable {report_to} "
                         f"tracker; check the installation (`{INSTALL[report_to]}`)")
    return accelerator


def flat_config(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """run.json as one level of 'profile/name': 'tiny' pairs of bool, int, float, str or None (what
    every tracker's config takes); lists become JSON text, anything else its str()."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, prefix=f"{name}/"))
        elif value is None or isinstance(value, bool | int | float | str):
            flat[name] = value
        else:
            is_list = isinstance(value, list | tuple)
            flat[name] = json.dumps(value, default=str) if is_list else str(value)
    return flat


def start_tracking(accelerator: Any, report_to: str, output_dir: Path,
                   record: Mapping[str, Any]) -> None:
    """`init_trackers` with the run's settings as config (accelerate: on the main process only)."""
    if report_to == "none":
        return
    init_kwargs: dict[str, dict[str, Any]] = {}
    if report_to == "wandb":  # offline unless the user chose a mode: no account, no network needed
        (output_dir / TRACKING_DIR).mkdir(parents=True, exist_ok=True)
        init_kwargs["wandb"] = {"name": output_dir.name, "dir": str(output_dir / TRACKING_DIR),
                                "mode": os.environ.get("WANDB_MODE", "offline")}
    elif report_to == "trackio":
        init_kwargs["trackio"] = {"name": output_dir.name}
    accelerator.init_trackers(PROJECT, config=flat_config(record), init_kwargs=init_kwargs)


def tracker_values(metrics: Mapping[str, float]) -> dict[str, float]:
    """One PPO step's metrics under their tracker names (the step is the x axis, not a value)."""
    return {TRACKER_NAMES[key]: float(value)
            for key, value in metrics.items() if key in TRACKER_NAMES}


def log_metrics(accelerator: Any, metrics: Mapping[str, float]) -> None:
    """Send one PPO step's metrics to the trackers at its step (a no-op without trackers)."""
    if accelerator.trackers:
        accelerator.log(tracker_values(metrics), step=int(metrics["step"]))
