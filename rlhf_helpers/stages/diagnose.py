"""Command line: the run doctor on a finished run, and its report at the end of a training run.

    python -m rlhf_helpers.stages.diagnose runs/ppo-tiny         # print the findings
    python -m rlhf_helpers.stages.diagnose runs/ppo-tiny --json  # diagnosis.json's text on stdout
    python -m rlhf_helpers.stages.diagnose trl-out/ --min-severity warning  # a TRL trainer's folder

RUN_DIR is this course's run folder (metrics.jsonl and run.json, as `train_ppo` writes them), a
metrics.jsonl, or the output folder of TRL's GRPOTrainer or RLOOTrainer (trainer_state.json, at its
top or in its newest checkpoint-N): TRL's names are mapped where they mean the same quantity
(`doctor.TRL_NAMES`). It reads and prints, naming the file it read; it writes nothing. Exit
status: 0 read (whatever it found); 2 no run could be read there (one line); 130 Ctrl-C (one line).

`train_ppo` calls `report_diagnosis` when a run ends: it prints the findings on stderr, writes
diagnosis.json into the run folder (atomically) and sends each rule's number of steps to the
tracker.
"""

from __future__ import annotations

# ruff: noqa: E402 - as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("python -m rlhf_helpers.stages.diagnose")

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.doctor import (
    DIAGNOSIS_FILE,
    SEVERITIES,
    Diagnosis,
    diagnose,
    format_findings,
)
from rlhf_helpers.ppo.checkpoint import disk_problem
from rlhf_helpers.ppo.metrics import write_replacing
from rlhf_helpers.runtime.interrupt import one_line_interrupt
from rlhf_helpers.stages.curves_page import CURVES_FILE, write_run_curves

PROG = "python -m rlhf_helpers.stages.diagnose"


def write_diagnosis(diagnosis: Diagnosis, output_dir: Path) -> Path:
    """diagnosis.json in `output_dir`, written to a temporary name and renamed (never half
    written)."""
    path = output_dir / DIAGNOSIS_FILE
    # never through a link
    write_replacing(path, json.dumps(diagnosis.to_json(), indent=2, allow_nan=False) + "\n")
    return path


def tracker_values(diagnosis: Diagnosis) -> dict[str, float]:
    """What the trackers get: per rule that fired, the number of steps it holds at, and the counts
    by severity."""
    values = {f"doctor/{f.rule}": float(len(f.steps)) for f in diagnosis.findings}
    values.update({f"doctor/{level}s": float(sum(f.severity == level for f in diagnosis.findings))
                   for level in SEVERITIES})
    return values


def report_diagnosis(trainer: Any, output_dir: Path, accelerator: Any = None,
                     diagnosis: Diagnosis | None = None) -> Diagnosis:
    """The end of a training run: diagnose its history (unless `diagnosis` is given), print the
    findings on stderr, write diagnosis.json and log the tracker values at the last step. OSError
    when diagnosis.json cannot be written."""
    diagnosis = diagnosis if diagnosis is not None else diagnose(trainer)
    print(format_findings(diagnosis), file=sys.stderr, flush=True)
    write_diagnosis(diagnosis, output_dir)
    if accelerator is not None and getattr(accelerator, "trackers", None) and trainer.history:
        accelerator.log(tracker_values(diagnosis), step=int(trainer.history[-1]["step"]))
    return diagnosis


def write_verdict(trainer: Any, output_dir: Path, accelerator: Any, profile_name: str,
                  status: str) -> str:
    """diagnosis.json, then curves.html marked with it; one file not written leaves the other.
    Returns the status ("write failed" when one could not be written)."""
    diagnosis = diagnose(trainer)
    writers = (
        (DIAGNOSIS_FILE, lambda: report_diagnosis(trainer, output_dir, accelerator, diagnosis)),
        (CURVES_FILE, lambda: write_run_curves(trainer.history, output_dir / CURVES_FILE,
                                               profile_name, diagnosis, status)))
    for name, write in writers:
        try:
            write()
        except OSError as error:
            status = "write failed"
            print(f"could not write {name} in {output_dir}: {disk_problem(error, output_dir)} "
                  "(metrics.jsonl holds the same numbers)", file=sys.stderr)
    return status


@one_line_interrupt(PROG, "nothing was written")
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="a run folder (metrics.jsonl + run.json), a metrics.jsonl, or a TRL "
                             "output folder")
    parser.add_argument("--json", action="store_true",
                        help="print the diagnosis as JSON (diagnosis.json's content, with the file "
                             "read and the notes)")
    parser.add_argument("--min-severity", choices=SEVERITIES, default="info",
                        help="print only findings at this severity or above (default: info, "
                             "everything)")
    args = parser.parse_args(argv)
    try:
        diagnosis = diagnose(args.run_dir)
        if diagnosis.steps == 0:
            raise ValueError(f"{diagnosis.source_file or args.run_dir} holds no logged step: "
                             "nothing to diagnose")
    except (ValueError, OSError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    text = (json.dumps(diagnosis.read_json(), indent=2, allow_nan=False) if args.json  # strict JSON
            else format_findings(diagnosis, args.min_severity))
    try:
        print(text, flush=True)
    except BrokenPipeError:  # the reader stopped early (`| head`): what it read is all it wanted
        # the exit's flush writes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
