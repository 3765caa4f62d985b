"""Does PPO learn? The tiny profile's PPO against best-of-n, and over-optimisation without KL.

    python -m benchmarks.bench_ppo_learning         # 3 seeds x 3 min PPO, best-of-1/4/16, kl_coef=0
    python -m benchmarks.bench_ppo_learning --fast  # smoke run: 1 seed, few steps, 32 eval prompts
    python -m benchmarks.bench_ppo_learning --seeds 0 1 --train-seconds 120 --threads 2
    python -m benchmarks.bench_ppo_learning --replot runs/bench_ppo_learning/results.json  # figure

What is measured, all on the held-out prompts of data/prompts_test.jsonl, graded by the hidden
ground-truth scorer (which PPO never sees; it optimises the learned reward adapter):
- PPO curve: every `eval_every` PPO steps, one sample per held-out prompt (fixed sampling seed):
  mean hidden score, mean learned reward, and the sequence KL to the SFT reference (sum over
  response tokens of log pi - log ref). Training time excludes these evaluations. One curve per
  seed.
- best-of-n baselines (n = 1, 4, 16): n SFT samples per prompt, keep the one the learned reward
  likes best, grade it with the hidden scorer. Their KL to the SFT model is the analytic log n -
  (n - 1)/n.
- over-optimisation: PPO with kl_coef = 0 for many steps (evaluated after each of the first 8 steps,
  where the peak is); the learned reward keeps rising while the hidden score peaks and falls (the
  hidden scorer penalises repetition and over-long answers that the preference pairs rarely show).
The goal (tiny profile, 2-core CPU): within `train_seconds` (3 min) the mean hidden score of PPO's
samples rises above SFT best-of-4, at a moderate KL.

Output: a printed table, `runs/bench_ppo_learning/results.json`, the plotly figure
`runs/bench_ppo_learning/ppo_curve.html`, and its PNG `docs/img/ppo_curve.png` (rendered headless by
Chromium through Playwright; skipped with a note when either is missing).
Timings on a shared machine are noisy: the CPU seconds of this process are reported next to wall
time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PNG_PATH = REPO / "docs" / "img" / "ppo_curve.png"
BEST_OF = (1, 4, 16)


def out_dir() -> Path:
    """Where the results and the HTML figure go: runs/bench_ppo_learning/, under $RLHF_RUNS_DIR when
    it is set."""
    from rlhf_helpers.runtime.artifacts import runs_dir

    return runs_dir() / "bench_ppo_learning"


def _setup(threads: int) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(threads)


def run_ppo(profile: Any, reward_dir: Path, eval_prompts: Sequence[str], seed: int,
            train_seconds: float, max_steps: int, eval_every: int, label: str, clock: str = "cpu",
            dense_until: int = 0, **config_overrides: Any) -> dict[str, Any]:
    """Train one PPO run until `train_seconds` of training (evaluations excluded; counted in CPU
    seconds of this process or in wall seconds, see `clock`) or `max_steps`; returns its evaluation
    curve and the per-step training metrics. Evaluates after every step up to `dense_until`, then
    every `eval_every` steps."""
    import torch

    from rlhf_helpers.ppo.model.build import build_shared_model
    from rlhf_helpers.ppo.trainer import PPOTrainer
    from rlhf_helpers.runtime.data import load_prompts
    from rlhf_helpers.world.scorer import hidden_scores

    config = profile.ppo.replace(seed=seed, progress_bar=False, **config_overrides)
    torch.manual_seed(seed)
    model, tokenizer = build_shared_model(profile, config, reward_dir)
    trainer = PPOTrainer(config, model, tokenizer, load_prompts("train"),
                         hidden_score_fn=hidden_scores)
    curve: list[dict[str, float]] = []

    def evaluate(wall: float, cpu: float) -> None:
        row = trainer.evaluate(list(eval_prompts))
        row.update(step=float(trainer.step_count), train_seconds=wall, train_cpu_seconds=cpu)
        curve.append(row)
        print(f"  [{label}] step {trainer.step_count:3d}  t {wall:6.1f} s  hidden "
              f"{row['eval_hidden_score']:+.3f}  reward {row['eval_score']:+.3f}  KL "
              f"{row['eval_kl']:.3f}",
              flush=True)

    wall = cpu = 0.0
    evaluate(wall, cpu)
    while (cpu if clock == "cpu" else wall) < train_seconds and trainer.step_count < max_steps:
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        trainer.step()
        wall += time.perf_counter() - start_wall
        cpu += time.process_time() - start_cpu
        if trainer.step_count <= dense_until or trainer.step_count % eval_every == 0:
            evaluate(wall, cpu)
    if curve[-1]["step"] != trainer.step_count:
        evaluate(wall, cpu)
    return {"label": label, "seed": seed, "config": config.to_dict(), "curve": curve,
            "history": trainer.history, "train_seconds": wall, "train_cpu_seconds": cpu,
            "steps": trainer.step_count}


def run_best_of_n(profile: Any, reward_dir: Path, eval_prompts: Sequence[str], ns: Sequence[int],
                  seed: int = 0) -> dict[str, Any]:
    """best-of-n of the SFT model for every n in ns, from one draw of max(ns) samples per prompt
    (`rlhf_helpers.compare.run_best_of_n`, the same baseline notebook 07 races against)."""
    from rlhf_helpers.compare import CompareConfig
    from rlhf_helpers.compare import run_best_of_n as draw

    config = CompareConfig.from_profile(profile, best_of=tuple(ns), seed=seed,
                                        n_eval_prompts=len(eval_prompts))
    rows = draw(config, profile, reward_dir, eval_prompts)
    seconds = next(iter(rows.values()))["seconds"]  # one draw serves every n
    return {
        "rows": {n: {k: v for k, v in row.items() if k != "seconds"} for n, row in rows.items()},
        "seconds": seconds, "n_max": max(ns)}


def best_point(curve: Sequence[dict[str, float]],
               key: str = "eval_hidden_score") -> dict[str, float]:
    """The evaluation row with the highest `key`."""
    return max(curve, key=lambda row: row[key])


def first_time_above(curve: Sequence[dict[str, float]], level: float,
                     clock: str = "cpu") -> float | None:
    """Training seconds (CPU or wall) of the first evaluation whose hidden score exceeds `level`
    (None: never)."""
    key = "train_cpu_seconds" if clock == "cpu" else "train_seconds"
    for row in curve:
        if row["eval_hidden_score"] > level:
            return row[key]
    return None


def make_figure(ppo_runs: Sequence[dict], baselines: dict[str, Any], overopt: dict | None,
                clock: str = "cpu", n_prompts: int | None = None) -> Any:
    """A 2 x 2 figure 900 px wide: hidden score and KL over training time (best-of-n as horizontal
    lines), hidden score against KL, and the kl_coef = 0 run (learned reward, hidden score, KL)."""
    from plotly.subplots import make_subplots

    colors = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
    base_colors = {1: "#7f7f7f", 4: "#ff7f0e", 16: "#d62728"}
    time_key = "train_cpu_seconds" if clock == "cpu" else "train_seconds"
    time_title = (
        f"training {'CPU ' if clock == 'cpu' else ''}seconds (1 thread, evaluations excluded)")
    titles = ("hidden score over training", "KL to the SFT model over training",
              "hidden score against KL", "kl_coef = 0: learned reward up, hidden score down")
    fig = make_subplots(rows=2, cols=2, subplot_titles=titles, horizontal_spacing=0.1,
                        vertical_spacing=0.16, specs=[[{}, {}], [{}, {"secondary_y": True}]])
    for i, run in enumerate(ppo_runs):
        color = colors[i % len(colors)]
        curve = run["curve"]
        seconds = [r[time_key] for r in curve]
        hidden = [r["eval_hidden_score"] for r in curve]
        kls = [r["eval_kl"] for r in curve]
        steps = [f"step {int(r['step'])}" for r in curve]
        common = {"mode": "lines+markers", "line": {"color": color, "width": 2},
                  "marker": {"size": 5}, "legendgroup": f"seed{run['seed']}", "text": steps}
        fig.add_scatter(x=seconds, y=hidden, name=f"PPO seed {run['seed']}", row=1, col=1, **common)
        fig.add_scatter(x=seconds, y=kls, showlegend=False, row=1, col=2, **common)
        fig.add_scatter(x=kls, y=hidden, showlegend=False, row=2, col=1, **common)
    for n, row in baselines["rows"].items():
        n = int(n)
        color = base_colors.get(n, "#17becf")
        fig.add_hline(y=row["hidden"], line={"dash": "dash", "color": color, "width": 1.5}, row=1,
                      col=1, annotation_text=f"best-of-{n}", annotation_position="bottom right",
                      annotation_font={"color": color})
        if row["kl"] > 0:
            fig.add_hline(y=row["kl"], line={"dash": "dash", "color": color, "width": 1.5}, row=1,
                          col=2, annotation_text=f"best-of-{n}: {row['kl']:.2f}",
                          annotation_position="bottom right", annotation_font={"color": color})
        fig.add_scatter(x=[row["kl"]], y=[row["hidden"]], mode="markers", name=f"SFT best-of-{n}",
                        marker={"size": 12, "symbol": "diamond", "color": color}, row=2, col=1)
    fig.update_xaxes(title_text=time_title, row=1, col=1)
    fig.update_xaxes(title_text=time_title, row=1, col=2)
    fig.update_yaxes(title_text="mean hidden score", row=1, col=1)
    fig.update_yaxes(title_text="KL (nats per response)", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(
        title_text="KL(policy || SFT), nats per response", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="mean hidden score", row=2, col=1)
    if overopt is not None:
        curve = overopt["curve"]
        steps = [r["step"] for r in curve]
        fig.add_scatter(x=steps, y=[r["eval_score"] for r in curve], mode="lines+markers",
                        marker={"size": 4}, name="kl_coef=0: learned reward",
                        line={"color": "#d62728", "width": 2}, row=2, col=2)
        fig.add_scatter(x=steps, y=[r["eval_hidden_score"] for r in curve], mode="lines+markers",
                        marker={"size": 4}, name="kl_coef=0: hidden score",
                        line={"color": "#1f77b4", "width": 2}, row=2, col=2)
        fig.add_scatter(x=steps, y=[r["eval_kl"] for r in curve], mode="lines",
                        name="kl_coef=0: KL (right axis)",
                        line={"color": "#7f7f7f", "dash": "dot", "width": 2}, row=2, col=2,
                        secondary_y=True)
        fig.update_xaxes(title_text="PPO step", row=2, col=2)
        fig.update_yaxes(title_text="mean score", row=2, col=2)
        fig.update_yaxes(title_text="KL (nats)", row=2, col=2, secondary_y=True, showgrid=False,
                         tickmode="auto", rangemode="tozero")
    kl_coefs = sorted({run["config"]["kl_coef"] for run in ppo_runs})
    fig.update_layout(
        width=900, height=860, template="plotly_white", font={"size": 13},
        title={
            "text": f"Tiny profile: PPO (kl_coef {', '.join(map(str, kl_coefs))}) vs SFT best-of-n"
                       + (f", {n_prompts} held-out prompts" if n_prompts else ""), "x": 0.02},
        margin={"l": 60, "r": 60, "t": 80, "b": 40},
        legend={"orientation": "h", "y": -0.09, "x": 0.0, "font": {"size": 12}})
    return fig


def save_png(fig: Any, html_path: Path, png_path: Path) -> str:
    """Write the figure's HTML, then screenshot it with headless Chromium; returns a status line."""
    import shutil

    html_path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(html_path), include_plotlyjs=True, full_html=True)
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        return "PNG skipped: no chromium (apt-get install -y chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "PNG skipped: playwright is not installed"
    png_path.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            # device scale 2: a sharp picture where the README shows it 900 px wide on a HiDPI
            # screen
            page = browser.new_page(viewport={"width": int(fig.layout.width) + 40,
                                              "height": int(fig.layout.height) + 40},
                                    device_scale_factor=2)
            page.goto(html_path.resolve().as_uri())
            page.wait_for_selector(".main-svg", timeout=30_000)
            page.locator(".plotly-graph-div").first.screenshot(path=str(png_path))
        finally:
            browser.close()
    return f"PNG written: {png_path}"


def print_table(ppo_runs: Sequence[dict], baselines: dict, overopt: dict | None,
                threads: int) -> None:
    print(f"\nheld-out hidden score (data/prompts_test.jsonl), torch threads = {threads}; "
          "timings are wall seconds on a shared machine (noisy), CPU seconds in brackets")
    print(f"{'run':<22}{'hidden':>9}{'reward':>9}{'KL':>8}  note")
    for n, row in baselines["rows"].items():
        print(
            f"{'SFT best-of-' + str(n):<22}{row['hidden']:>+9.3f}{row['reward']:>+9.3f}"
            f"{row['kl']:>8.3f}"
            "  analytic KL log n - (n-1)/n")
    for run in ppo_runs:
        final, best = run["curve"][-1], best_point(run["curve"])
        print(f"{'PPO seed ' + str(run['seed']) + ' final':<22}{final['eval_hidden_score']:>+9.3f}"
              f"{final['eval_score']:>+9.3f}{final['eval_kl']:>8.3f}  step {int(final['step'])}, "
              f"{run['train_seconds']:.0f} s ({run['train_cpu_seconds']:.0f} s CPU)")
        print(f"{'PPO seed ' + str(run['seed']) + ' best':<22}{best['eval_hidden_score']:>+9.3f}"
              f"{best['eval_score']:>+9.3f}{best['eval_kl']:>8.3f}  step {int(best['step'])}, "
              f"{best['train_seconds']:.0f} s")
    if overopt is not None:
        curve = overopt["curve"]
        peak = best_point(curve)
        last = curve[-1]
        print(
            f"{'kl_coef=0 peak hidden':<22}{peak['eval_hidden_score']:>+9.3f}"
            f"{peak['eval_score']:>+9.3f}{peak['eval_kl']:>8.3f}  step {int(peak['step'])}")
        print(f"{'kl_coef=0 last':<22}{last['eval_hidden_score']:>+9.3f}{last['eval_score']:>+9.3f}"
              f"{last['eval_kl']:>8.3f}  step {int(last['step'])}")


def main(fast: bool = False, seeds: Sequence[int] = (0, 1, 2), train_seconds: float = 180.0,
         max_steps: int = 1000, eval_every: int = 4, overopt_steps: int = 100, threads: int = 1,
         n_eval_prompts: int | None = None, png: str | Path | None = PNG_PATH,
         clock: str = "cpu", jobs: int = 1) -> dict[str, Any]:
    """Run the PPO seeds, the best-of-n baselines and the over-optimisation run; return the figures.

    clock="cpu" budgets `train_seconds` in CPU seconds of this process: with one torch thread that
    is close to the wall time on an idle machine, and it does not shrink when other jobs share the
    CPU. clock="wall" budgets wall seconds. jobs > 1 runs the seeds, baselines and the kl_coef=0 run
    in that many processes side by side.
    """
    if clock not in ("cpu", "wall"):
        raise ValueError(f"clock must be 'cpu' or 'wall', got {clock!r}")
    _setup(threads)
    from rlhf_helpers.runtime.data import load_prompts
    from rlhf_helpers.runtime.profiles import get_profile
    from rlhf_helpers.stages.reward import ensure_reward_model

    profile = get_profile("tiny")
    if fast:
        seeds, train_seconds, max_steps, eval_every, overopt_steps = seeds[:1], 600.0, 3, 1, 3
        n_eval_prompts = n_eval_prompts or 32
        png = None
    eval_prompts = load_prompts("test")[: n_eval_prompts or profile.ppo.n_eval_prompts]
    start = time.perf_counter()
    reward_dir = ensure_reward_model(profile)
    print(f"reward adapter: {reward_dir} ({time.perf_counter() - start:.0f} s)", flush=True)

    # every run is independent: with jobs > 1 they run side by side in spawned processes (one torch
    # thread each); the CPU-second budget keeps each run's training length the same either way
    tasks: list[tuple[Any, tuple, dict]] = [
        (run_best_of_n, (profile, reward_dir, eval_prompts, (1, 4) if fast else BEST_OF), {})]
    tasks += [
        (run_ppo, (profile, reward_dir, eval_prompts, seed, train_seconds, max_steps, eval_every),
         {"label": f"seed {seed}", "clock": clock}) for seed in seeds]
    # its peak comes within the first few steps: evaluate every step up to step 8
    if overopt_steps > 0:
        tasks.append((run_ppo,
                      (profile, reward_dir, eval_prompts, seeds[0], float("inf"), overopt_steps,
                       eval_every), {"label": "kl_coef=0", "dense_until": 0 if fast else 8,
                                     "kl_coef": 0.0, "target_kl": None}))
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_setup, initargs=(threads,)) as pool:
            futures = [pool.submit(fn, *args, **kwargs) for fn, args, kwargs in tasks]
            outputs = [future.result() for future in futures]
    else:
        outputs = [fn(*args, **kwargs) for fn, args, kwargs in tasks]
    baselines, ppo_runs = outputs[0], outputs[1 : 1 + len(seeds)]
    overopt = outputs[-1] if overopt_steps > 0 else None
    print_table(ppo_runs, baselines, overopt, threads)

    settings = {"threads": threads, "n_eval_prompts": len(eval_prompts), "clock": clock,
                "train_seconds_budget": train_seconds}
    results = {"settings": settings, "baselines": baselines, "ppo": ppo_runs, "overopt": overopt}
    results["figures"] = figures = summarise(results)
    out_dir().mkdir(parents=True, exist_ok=True)
    (out_dir()
     / ("results-fast.json" if fast else "results.json")).write_text(json.dumps(results, indent=1))
    print(render(results, None if fast else png, fast))
    return figures


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """The flat figures of a run's results (what `main` returns and the README table reports)."""
    baselines, ppo_runs, overopt = results["baselines"], results["ppo"], results["overopt"]
    clock = results["settings"]["clock"]
    rows = {int(n): row for n, row in baselines["rows"].items()}  # JSON turns the keys into strings
    bo4 = rows[4]["hidden"]
    figures: dict[str, Any] = dict(results["settings"])
    for n, row in rows.items():
        figures[f"best_of_{n}_hidden"] = row["hidden"]
        figures[f"best_of_{n}_hidden_se"] = row.get("hidden_se")
        figures[f"best_of_{n}_kl"] = row["kl"]
    finals = [run["curve"][-1] for run in ppo_runs]
    for run, final in zip(ppo_runs, finals, strict=True):
        name = f"ppo_seed{run['seed']}"
        best = best_point(run["curve"])
        last3 = run["curve"][-3:]
        figures[f"{name}_final_hidden"] = final["eval_hidden_score"]
        figures[f"{name}_final_reward"] = final["eval_score"]
        figures[f"{name}_final_kl"] = final["eval_kl"]
        figures[f"{name}_last3_hidden"] = sum(r["eval_hidden_score"] for r in last3) / len(last3)
        figures[f"{name}_last3_kl"] = sum(r["eval_kl"] for r in last3) / len(last3)
        figures[f"{name}_best_hidden"] = best["eval_hidden_score"]
        figures[f"{name}_best_step"] = best["step"]
        figures[f"{name}_steps"] = run["steps"]
        figures[f"{name}_train_seconds"] = run["train_seconds"]
        figures[f"{name}_train_cpu_seconds"] = run["train_cpu_seconds"]
        figures[f"{name}_seconds_to_beat_bo4"] = first_time_above(run["curve"], bo4, clock)
    figures["ppo_final_hidden_mean"] = sum(f["eval_hidden_score"] for f in finals) / len(finals)
    figures["ppo_final_kl_mean"] = sum(f["eval_kl"] for f in finals) / len(finals)
    figures["ppo_beats_bo4_all_seeds"] = all(f["eval_hidden_score"] > bo4 for f in finals)
    if overopt is not None:
        curve = overopt["curve"]
        peak = best_point(curve)
        after_peak = [r for r in curve if r["step"] > peak["step"]]
        # "falls": the first evaluation after the peak below the SFT model's own score (step 0)
        fall = next(
            (r for r in after_peak if r["eval_hidden_score"] < curve[0]["eval_hidden_score"]), None)
        lowest = min(after_peak or [peak], key=lambda r: r["eval_hidden_score"])
        for label, row in (("start", curve[0]), ("peak", peak), ("fall", fall), ("lowest", lowest),
                           ("last", curve[-1])):
            if row is None:
                continue
            figures[f"overopt_{label}_step"] = row["step"]
            figures[f"overopt_{label}_hidden"] = row["eval_hidden_score"]
            figures[f"overopt_{label}_reward"] = row["eval_score"]
            figures[f"overopt_{label}_kl"] = row["eval_kl"]
    return figures


def render(results: dict[str, Any], png: str | Path | None, fast: bool = False) -> str:
    """Write the figure's HTML (and its PNG when `png` is a path); returns a status line."""
    fig = make_figure(results["ppo"], results["baselines"], results["overopt"],
                      results["settings"]["clock"], n_prompts=results["settings"]["n_eval_prompts"])
    if png is None:
        out_dir().mkdir(parents=True, exist_ok=True)
        html = out_dir() / ("ppo_curve-fast.html" if fast else "ppo_curve.html")
        fig.write_html(str(html))
        return f"figure written: {html} (no PNG)"
    return save_png(fig, out_dir() / "ppo_curve.html", Path(png))


def replot(results_path: str | Path, png: str | Path | None = PNG_PATH) -> dict[str, Any]:
    """Figures and picture again from a saved results.json, without training."""
    results = json.loads(Path(results_path).read_text())
    results["figures"] = figures = summarise(results)
    print(render(results, png))
    return figures


def cli(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true",
                        help="smoke run: 1 seed, 3 steps, 32 eval prompts")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train-seconds", type=float, default=180.0,
                        help="training budget per seed")
    parser.add_argument("--eval-every", type=int, default=4,
                        help="evaluate every this many PPO steps")
    parser.add_argument("--overopt-steps", type=int, default=100,
                        help="steps of the kl_coef=0 run (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--n-eval-prompts", type=int, default=None,
                        help="held-out prompts (default: profile)")
    parser.add_argument("--no-png", action="store_true",
                        help="do not render docs/img/ppo_curve.png")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs side by side in separate processes")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="budget train-seconds in CPU seconds of this process (default) or "
                             "wall seconds")
    parser.add_argument("--replot", metavar="RESULTS_JSON", default=None,
                        help="no training: figures and picture again from a saved results.json")
    args = parser.parse_args(argv)
    if args.replot:
        return replot(args.replot, None if args.no_png else PNG_PATH)
    return main(fast=args.fast, seeds=args.seeds, train_seconds=args.train_seconds,
                eval_every=args.eval_every, overopt_steps=args.overopt_steps, threads=args.threads,
                n_eval_prompts=args.n_eval_prompts,
                png=None if args.no_png else PNG_PATH, clock=args.clock, jobs=args.jobs)


if __name__ == "__main__":
    print(json.dumps(cli(), indent=1, default=str))
