"""The pure pieces of the PPO-learning benchmark (no model, no training): the figures it reports are
read off hand-made curves whose answers are known.

The benchmark itself (`python -m benchmarks.bench_ppo_learning`) is run by hand: its figures come
from minutes of training on a shared machine and belong in benchmarks/README.md, not in assertions.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# `benchmarks` is a folder of the repository, not an installed package
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_ppo_learning as bench  # noqa: E402


def _row(step: int, hidden: float, reward: float = 0.0, kl: float = 0.0,
         cpu: float | None = None) -> dict:
    cpu = float(step) if cpu is None else cpu
    return {"step": float(step), "eval_hidden_score": hidden, "eval_score": reward, "eval_kl": kl,
            "train_cpu_seconds": cpu, "train_seconds": 2 * cpu}


def _run(seed: int, curve: list[dict]) -> dict:
    return {"seed": seed, "config": {"kl_coef": 0.2}, "curve": curve,
            "steps": int(curve[-1]["step"]), "train_seconds": curve[-1]["train_seconds"],
            "train_cpu_seconds": curve[-1]["train_cpu_seconds"]}


def _results() -> dict:
    baselines = {"rows": {1: {"hidden": -0.4, "reward": 0.1, "kl": 0.0, "hidden_se": 0.1},
                          4: {"hidden": 0.6, "reward": 2.2, "kl": math.log(4) - 3 / 4,
                              "hidden_se": 0.07}}}
    seed0 = [_row(0, -0.5), _row(4, 0.5, kl=1.0), _row(8, 0.9, kl=2.0), _row(12, 0.7, kl=3.0)]
    seed1 = [_row(0, -0.5), _row(4, 0.7, kl=1.5), _row(8, 0.4, kl=2.5)]
    # kl_coef = 0: peak at step 2, below the SFT score (-0.5) from step 6 on, lowest at step 8
    overopt = [_row(0, -0.5, 0.1), _row(1, 0.2, 1.0), _row(2, 0.6, 2.0, 3.0), _row(4, -0.1, 3.0),
               _row(6, -1.5, 3.5, 40.0), _row(8, -2.5, 3.7), _row(10, -2.0, 3.8, 90.0)]
    return {"settings": {"threads": 1, "n_eval_prompts": 200, "clock": "cpu",
                         "train_seconds_budget": 12.0},
            "baselines": baselines, "ppo": [_run(0, seed0), _run(1, seed1)],
            "overopt": _run(0, overopt)}


def test_first_time_above_reads_the_chosen_clock() -> None:
    curve = [_row(0, -0.5), _row(4, 0.5, cpu=10.0), _row(8, 0.9, cpu=20.0)]
    assert bench.first_time_above(curve, 0.6) == 20.0
    assert bench.first_time_above(curve, 0.6, clock="wall") == 40.0
    assert bench.first_time_above(curve, 0.4) == 10.0
    assert bench.first_time_above(curve, 1.0) is None


def test_summarise_per_seed_figures() -> None:
    figures = bench.summarise(_results())
    assert figures["best_of_4_kl"] == pytest.approx(0.6362943611198906)
    assert figures["ppo_seed0_final_hidden"] == 0.7 and figures["ppo_seed0_final_kl"] == 3.0
    assert figures["ppo_seed0_best_hidden"] == 0.9 and figures["ppo_seed0_best_step"] == 8.0
    assert figures["ppo_seed0_last3_hidden"] == pytest.approx((0.5 + 0.9 + 0.7) / 3)
    assert figures["ppo_seed0_seconds_to_beat_bo4"] == 8.0
    assert figures["ppo_seed1_seconds_to_beat_bo4"] == 4.0
    assert figures["ppo_final_hidden_mean"] == pytest.approx((0.7 + 0.4) / 2)
    # seed 1 ends below best-of-4 (0.4 < 0.6) although it was above it at step 4
    assert figures["ppo_beats_bo4_all_seeds"] is False


def test_summarise_over_optimisation_points() -> None:
    figures = bench.summarise(_results())
    assert (figures["overopt_peak_step"], figures["overopt_peak_hidden"],
            figures["overopt_peak_reward"]) == (
        2.0, 0.6, 2.0)
    # the first evaluation after the peak whose hidden score is below the SFT model's (step 0: -0.5)
    assert (figures["overopt_fall_step"], figures["overopt_fall_hidden"],
            figures["overopt_fall_kl"]) == (
        6.0, -1.5, 40.0)
    assert (figures["overopt_lowest_step"], figures["overopt_lowest_hidden"]) == (8.0, -2.5)
    assert (figures["overopt_last_step"], figures["overopt_last_reward"]) == (10.0, 3.8)


def test_summarise_after_a_json_round_trip() -> None:
    """results.json turns the best-of-n keys into strings; --replot must read it back the same."""
    results = _results()
    again = json.loads(json.dumps(results))
    assert bench.summarise(again) == bench.summarise(results)


def test_no_fall_when_the_hidden_score_never_drops_below_sft() -> None:
    results = _results()
    results["overopt"]["curve"] = [_row(0, -0.5), _row(2, 0.3), _row(4, 0.8), _row(6, 0.1)]
    figures = bench.summarise(results)
    assert figures["overopt_peak_step"] == 4.0
    assert "overopt_fall_step" not in figures
    assert figures["overopt_lowest_step"] == 6.0


def test_clock_is_checked() -> None:
    with pytest.raises(ValueError, match="clock"):
        bench.main(clock="gpu")


def test_figure_has_every_curve_and_best_of_n_line() -> None:
    results = _results()
    fig = bench.make_figure(results["ppo"], results["baselines"], results["overopt"], n_prompts=200)
    # per seed: hidden vs time, KL vs time, hidden vs KL; one marker per best-of-n; 3 kl_coef=0
    # curves
    assert len(fig.data) == 2 * 3 + 2 + 3
    # best-of-1 and best-of-4 on the score panel; only best-of-4 on the KL panel (best-of-1's KL
    # is 0)
    assert sorted(shape.y0 for shape in fig.layout.shapes) == pytest.approx(
        sorted([-0.4, 0.6, math.log(4) - 3 / 4]))
    assert fig.layout.width == 900
    hidden_vs_time = fig.data[0]
    assert (list(hidden_vs_time.x) == [0.0, 4.0, 8.0, 12.0]
            and list(hidden_vs_time.y) == [-0.5, 0.5, 0.9, 0.7])
