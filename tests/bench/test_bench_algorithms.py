"""The pure pieces of the algorithm-comparison benchmark (no model, no training): its table is read
off hand-made curves whose answers are known. The benchmark itself (`python -m
benchmarks.bench_algorithms`) is run by hand; its figures belong in benchmarks/README.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# `benchmarks` is a folder of the repository, not an installed package
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_algorithms as bench  # noqa: E402


def _run(method: str, seed: int, points: list[tuple[float, float, float]],
         peak: float = 100.0) -> dict:
    """points: (train_seconds, hidden, kl); samples = 64 per second, for a known column."""
    curve = [{"train_seconds": t, "eval_hidden_score": h, "eval_kl": k, "eval_score": 2 * h,
              "samples": 64 * t, "step": t} for t, h, k in points]
    return {"method": method, "label": method.upper(), "curve": curve, "peak_memory_mb": peak,
            "trainable_parameters": 10 if method == "ppo" else 5,
            "settings": {"seed": seed, "train_seconds": 30}}


def _results() -> dict:
    return {"best_of": {"1": {"hidden": -0.4, "reward": 0.1, "kl": 0.0, "hidden_se": 0.1},
                        "4": {"hidden": 0.6, "reward": 2.2, "kl": 0.64, "hidden_se": 0.05}},
            "runs": [_run("ppo", 0, [(0, -0.5, 0), (10, 0.7, 1), (30, 0.9, 2)], peak=200.0),
                     _run("ppo", 1, [(0, -0.5, 0), (10, 0.5, 1), (30, 0.7, 3)], peak=100.0),
                     _run("grpo", 0, [(0, -0.5, 0), (10, 0.2, 0.5), (30, 0.5, 1)])]}


def test_summary_reads_means_ranges_and_first_time_above_best_of_4():
    rows = {row["method"]: row for row in bench.summarise(_results())}
    assert set(rows) == {"ppo", "grpo"}  # rloo has no runs: no row
    ppo = rows["ppo"]
    assert ppo["hidden"] == pytest.approx((0.8, 0.7, 0.9))
    assert ppo["kl"] == pytest.approx((2.5, 2.0, 3.0))
    assert ppo["first_above_best_of_4"] == [10, 30]  # seed 1 passes 0.6 only at its last evaluation
    assert (ppo["peak_memory_mb"] == pytest.approx(150.0)
            and ppo["samples"] == pytest.approx(64 * 30))
    assert rows["grpo"]["first_above_best_of_4"] == [None]


def test_table_has_a_row_per_method_and_per_best_of_n():
    text = bench.table(_results())
    assert "| PPO | **0.800** (0.700 to 0.900)" in text
    assert "| 10, 30 |" in text and "| never |" in text
    assert "| SFT best-of-4 | **0.600**" in text


def test_a_dpo_run_gets_its_row_and_an_unknown_method_is_refused_before_any_run():
    results = _results()
    results["runs"].append(_run("dpo", 0, [(0, -0.5, 0), (10, 0.4, 0.6), (30, 0.8, 1.5)]))
    rows = {row["method"]: row for row in bench.summarise(results)}
    assert rows["dpo"]["hidden"] == pytest.approx((0.8, 0.8, 0.8))
    assert rows["dpo"]["first_above_best_of_4"] == [30]
    with pytest.raises(ValueError, match="methods must be some of"):
        bench.main(methods=("ppo", "sac"))  # refused before a process starts
