"""Do you need a critic? PPO against TRL's GRPO and RLOO, and best-of-n, on the tiny world.

    python -m benchmarks.bench_algorithms         # 3 seeds x 180 CPU s per method, 2 jobs
    python -m benchmarks.bench_algorithms --fast  # smoke run: 1 seed, 6 CPU s, 32 eval prompts
    python -m benchmarks.bench_algorithms --methods ppo grpo rloo dpo   # TRL's DPO too
    python -m benchmarks.bench_algorithms --replot runs/bench_algorithms/results.json

Every method trains a LoRA policy on the shipped SFT model against the same learned reward adapter,
from the same training prompts, for the same budget of process CPU seconds (model building and
evaluations excluded; one torch thread per run), and is judged at 3.75, 7.5, 15, 30, 60, ... 180 CPU
s by the same function
(`rlhf_helpers.ppo.evaluation.evaluate_policy`): one sample per held-out prompt (200), hidden score,
learned reward and KL to the SFT model. The settings are notebook 07's (`CompareConfig.from_profile`
of the tiny profile: 64 responses per batch, lr 1e-3, beta 0.2, G = 4 for GRPO and RLOO).
Each (method, seed) runs in its own spawned process, so its peak memory (resident memory above the
process's memory after start-up) is its own. best-of-n (1, 4, 16) of the SFT model is the untrained
reference; its KL is the analytic log n - (n - 1)/n.

Output: a printed markdown table, runs/bench_algorithms/results.json, the figure
runs/bench_algorithms/algorithms.html and its PNG docs/img/algorithms_frontier.png.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PNG_PATH = REPO / "docs" / "img" / "algorithms_frontier.png"
METHODS = ("ppo", "grpo", "rloo")
#: Every method `--methods` accepts: notebook 07 races DPO too; the recorded figure is of METHODS.
ALL_METHODS = ("ppo", "grpo", "rloo", "dpo")


def out_dir() -> Path:
    """Where the results and the HTML figure go: runs/bench_algorithms/, under $RLHF_RUNS_DIR when
    it is set."""
    from rlhf_helpers.runtime.artifacts import runs_dir

    return runs_dir() / "bench_algorithms"


def _worker(task: dict[str, Any]) -> dict[str, Any]:
    """One (method, seed) run, or the best-of-n baseline, in a fresh process: a JSON-able dict."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from rlhf_helpers.compare import CompareConfig, run_best_of_n, run_method
    from rlhf_helpers.runtime.data import load_prompts
    from rlhf_helpers.runtime.memory import current_rss_mb
    from rlhf_helpers.runtime.profiles import get_profile
    from rlhf_helpers.stages.reward import ensure_reward_model

    profile = get_profile("tiny")
    reward_dir = ensure_reward_model(profile)
    config = CompareConfig.from_profile(profile, **task["config"])
    eval_prompts = load_prompts("test")
    if task["method"] == "best_of_n":
        return {"best_of": {str(n): row for n, row in run_best_of_n(config, profile, reward_dir,
                                                                    eval_prompts).items()}}
    start_rss = current_rss_mb()
    run = run_method(task["method"], config, profile, reward_dir, eval_prompts, progress_bar=False)
    final = run.final
    print(f"  [{run.label} seed {config.seed}] {final['train_seconds']:.0f} CPU s: hidden "
          f"{final['eval_hidden_score']:+.3f}  reward {final['eval_score']:+.3f}  KL "
          f"{final['eval_kl']:.2f}  steps {final['step']:.0f}", flush=True)
    return {"method": run.method, "label": run.label, "clock": run.clock, "curve": run.curve,
            "peak_memory_mb": run.peak_memory_mb, "memory_how": run.memory_how,
            "start_rss_mb": start_rss,
            "trainable_parameters": run.trainable_parameters, "settings": run.settings}


def summarise(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per method: final hidden score, KL and learned reward (mean and range over seeds),
    the first CPU second above best-of-4, steps, peak memory."""
    import statistics

    best4 = results["best_of"]["4"]["hidden"]
    rows = []
    for method in ALL_METHODS:
        runs = [r for r in results["runs"] if r["method"] == method]
        if not runs:
            continue
        finals = [r["curve"][-1] for r in runs]

        def spread(key: str, finals=finals) -> tuple[float, float, float]:
            values = [f[key] for f in finals]
            return statistics.mean(values), min(values), max(values)

        firsts = []
        for r in runs:
            above = [row["train_seconds"] for row in r["curve"] if row["eval_hidden_score"] > best4]
            firsts.append(above[0] if above else None)
        rows.append({"method": method, "label": runs[0]["label"], "seeds": len(runs),
                     "hidden": spread("eval_hidden_score"), "kl": spread("eval_kl"),
                     "reward": spread("eval_score"),
                     "samples": statistics.mean(f["samples"] for f in finals),
                     "first_above_best_of_4": firsts,
                     "peak_memory_mb": statistics.mean(r["peak_memory_mb"] for r in runs),
                     "trainable_parameters": runs[0]["trainable_parameters"]})
    return rows


def table(results: dict[str, Any]) -> str:
    """The markdown table of `summarise`, then the best-of-n rows."""
    lines = [
        "| method | hidden score at the end (mean, min-max over seeds) | KL, nats | learned reward "
        "| responses trained on | first eval above best-of-4 (CPU s, per seed) | peak RSS rise, MB "
        "| trained params |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in summarise(results):
        h, k, r = row["hidden"], row["kl"], row["reward"]
        firsts = ", ".join("never" if f is None else f"{f:.0f}"
                           for f in row["first_above_best_of_4"])
        lines.append(
            f"| {row['label']} | **{h[0]:.3f}** ({h[1]:.3f} to {h[2]:.3f}) | {k[0]:.2f} "
            f"({k[1]:.2f}-{k[2]:.2f}) | {r[0]:.2f} | {row['samples']:.0f} | {firsts} | "
            f"{row['peak_memory_mb']:.0f} | {row['trainable_parameters']:,} |"
        )
    for n, row in sorted(results["best_of"].items(), key=lambda item: int(item[0])):
        lines.append(f"| SFT best-of-{n} | **{row['hidden']:.3f}** (se {row['hidden_se']:.3f}) | "
                     f"{row['kl']:.2f} (analytic) | {row['reward']:.2f} | | | | |")
    return "\n".join(lines)


def render(results: dict[str, Any], png: str | Path | None) -> str:
    from benchmarks.bench_ppo_learning import save_png
    from rlhf_helpers.compare.figures import comparison_figure

    seeds = sorted({r["settings"].get("seed") for r in results["runs"]})
    seconds = results["runs"][0]["settings"].get("train_seconds")
    fig = comparison_figure(results["runs"], {int(n): row for n, row in results["best_of"].items()},
                            title=f"Tiny profile, {seconds:.0f} CPU s per run, seeds {seeds}: same "
                                  "reward, same judge")
    out_dir().mkdir(parents=True, exist_ok=True)
    html = out_dir() / "algorithms.html"
    fig.write_html(str(html), include_plotlyjs="cdn")
    if png is None:
        return f"figure written: {html} (no PNG)"
    return save_png(fig, html, Path(png))


def main(fast: bool = False, seeds: Sequence[int] = (0, 1, 2), train_seconds: float = 180.0,
         eval_points: int = 6, early_evals: int = 3, jobs: int = 2,
         png: str | Path | None = PNG_PATH,
         methods: Sequence[str] = METHODS) -> dict[str, Any]:
    """Run every (method, seed) and the best-of-n baseline; print the table; write JSON and
    figure."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # the race in CPU seconds (train_batches None), unlike notebook 07's race in batches
    # (profile.compare_batches)
    config: dict[str, Any] = {"train_seconds": train_seconds, "train_batches": None,
                              "eval_points": eval_points, "early_evals": early_evals}
    if fast:
        seeds, config = (0,), {"train_seconds": 6.0, "train_batches": None, "eval_points": 2,
                               "early_evals": 1, "n_eval_prompts": 32}
        png = None
    tasks = [{"method": "best_of_n", "config": config}]
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown or not methods:
        raise ValueError(f"methods must be some of {ALL_METHODS}, got {list(methods)}")
    tasks += [{"method": m, "config": {**config, "seed": s}} for s in seeds for m in methods]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        outputs = list(pool.map(_worker, tasks))
    results = {"best_of": outputs[0]["best_of"], "runs": outputs[1:],
               "config": config, "jobs": jobs}
    out_dir().mkdir(parents=True, exist_ok=True)
    (out_dir() / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    print(render(results, png))
    return {f"{row['method']}_final_hidden": row["hidden"][0] for row in summarise(results)}


def cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true",
                        help="smoke run: 1 seed, 6 CPU s, 32 eval prompts")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train-seconds", type=float, default=180.0,
                        help="CPU seconds of training per run")
    parser.add_argument("--eval-points", type=int, default=6,
                        help="evaluations spread over the budget")
    parser.add_argument("--early-evals", type=int, default=3,
                        help="extra evaluations at 1/2, 1/4, ... of the first")
    parser.add_argument("--methods", nargs="+", choices=ALL_METHODS, default=list(METHODS),
                        help="methods to race (default: the recorded figure's three)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="runs side by side (one process and thread each)")
    parser.add_argument("--no-png", action="store_true",
                        help="do not render docs/img/algorithms_frontier.png")
    parser.add_argument("--replot", type=Path,
                        help="redraw the table and figure from a results.json")
    args = parser.parse_args(argv)
    png = None if args.no_png else PNG_PATH
    if args.replot:
        results = json.loads(args.replot.read_text())
        print(table(results))
        print(render(results, png))
        return {}
    return main(fast=args.fast, seeds=args.seeds, train_seconds=args.train_seconds,
                eval_points=args.eval_points, early_evals=args.early_evals, jobs=args.jobs, png=png,
                methods=args.methods)


if __name__ == "__main__":
    cli()
