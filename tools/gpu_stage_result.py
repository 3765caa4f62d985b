"""One JSON per stage of tools/gpu_checks.sh: what ran, where, on which code, and what it measured.

    python tools/gpu_stage_result.py STAGE EXIT_CODE SECONDS WORKDIR [--figures FILE] [--out FILE]

Writes WORKDIR/STAGE.result.json (or --out) holding the stage's exit code and seconds, the machine
(GPU name, compute capability, driver), the software (torch, its CUDA, transformers, peft, trl), the
commit ($RLHF_COMMIT, else `git rev-parse HEAD`, else "unknown": a device copy may have no .git),
the stage's own figures (its --json file, if any) and the last lines of its log. These files are
what benchmarks/results/ keeps and what the README's GPU figures are read from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 40  #: lines of the stage's log kept in the result (progress bars collapsed)


def commit_id(root: Path) -> str:
    """$RLHF_COMMIT, else the checkout's HEAD, else "unknown"."""
    if os.environ.get("RLHF_COMMIT"):
        return os.environ["RLHF_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def machine() -> dict[str, Any]:
    """GPU, driver and library versions of this process's environment."""
    import importlib.metadata as md

    import torch

    out: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        out["compute_capability"] = list(torch.cuda.get_device_capability())
        out["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    else:
        out["gpu"] = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        out["driver"] = smi.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        out["driver"] = None
    # which weights the gpu profile ran on: gpu_checks.sh sets {"weights": "gguf"} or {"weights":
    # "random"}
    out["profile_overrides"] = os.environ.get("RLHF_PROFILE_OVERRIDES")
    for name in ("transformers", "peft", "trl", "accelerate", "datasets", "gguf"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` lines of a log, each progress-bar redraw (carriage return) kept only
    once."""
    if not path.exists():
        return []
    # newline="": keep the \r of progress bars
    with path.open(errors="replace", newline="") as handle:
        text = handle.read()
    # not splitlines(): it splits at \r
    kept = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    return [line for line in kept if line][-lines:]


def stage_result(stage: str, exit_code: int, seconds: float, workdir: Path, figures_file: Path
                 | None, environment: dict[str, Any], commit: str) -> dict[str, Any]:
    """The result record of one stage (see the module docstring)."""
    if not stage:
        raise ValueError("stage must be a non-empty name")
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds}")
    figures = None
    if figures_file is not None and figures_file.exists():
        figures = json.loads(figures_file.read_text())
    return {"stage": stage, "passed": exit_code == 0, "exit_code": exit_code, "seconds": seconds,
            "commit": commit, **environment, "figures": figures,
            "log_tail": log_tail(workdir / f"{stage}.log")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage")
    parser.add_argument("exit_code", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--figures", type=Path, default=None,
                        help="the stage's own JSON of figures")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    record = stage_result(args.stage, args.exit_code, args.seconds, args.workdir, args.figures,
                          machine(), commit_id(root))
    out = args.out or args.workdir / f"{args.stage}.result.json"
    out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
