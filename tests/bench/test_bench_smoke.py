"""Every benchmark runs: each `benchmarks/bench_*.py` at its smallest size (`--fast`) on the CPU, in
a process of its own, writing only into this test's folder (its results) and the tests' shared cache
(the reward adapter the notebooks reuse); trl_baseline also builds (once) its trl==1.10.0 venv,
`.bench-venv-trl110/`, a virtual environment the checkout's write check leaves out, as it does
.venv. The gpu profile's SmolLM2 architecture runs with random weights and 2 layers (bench_memory):
the same code path as on a GPU, shrunk in layers, not in code. A benchmark added to the folder is
smoke-tested too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from run_folders import ROOT, SHARED_CACHE_DIR

from benchmarks.__main__ import discover

#: Minutes a fast run may take before it counts as hung (the slowest, trl_baseline, builds its TRL
#: 1.10 venv the first time: ~70 s here; algorithms trains the reward adapter when the shared cache
#: lacks it: ~66 s).
TIMEOUT_S = 900


@pytest.mark.parametrize("name", discover())
def test_every_benchmark_runs_at_its_smallest_size(name, tmp_path):
    env = {**os.environ, "RLHF_RUNS_DIR": str(tmp_path), "RLHF_CACHE_DIR": str(SHARED_CACHE_DIR),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-m", "benchmarks", name, "--fast"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "FAILED" not in out, out[-4000:]
    # both sides must run; without a package index the TRL venv cannot be built
    if name == "trl_baseline":
        if "SKIPPED:" in out and os.environ.get("CI", "").lower() not in ("1", "true"):
            pytest.skip("no trl==1.10.0 venv here (no package index): "
                        + out.split("SKIPPED:", 1)[1][:200])
        assert "running TRL 1.10 PPOTrainer" in out and "running our engine" in out, out[-4000:]
    assert f"=== bench_{name} ===" in out and "figures (" in out, out[-4000:]
    if name == "memory":  # the gpu profile's architecture, shrunk: it crashed in the warm-up before
        assert "smollm2_layers" in out and "smollm2_shared_estimate_mb" in out, out[-4000:]
