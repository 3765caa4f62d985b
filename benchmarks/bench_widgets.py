"""Benchmark: how long one slider move takes in each explorer, on each backend, side by side.

A real IPython kernel (ipykernel, started with jupyter_client) builds and displays each explorer and
drags one of its sliders from Python (`slider.value = ...`, the same path as a drag in the browser:
slider -> text box -> update). Each update recomputes with the maths core and redraws: the
"figurewidget" backend sends one Plotly.update comm message, the "html" backend (Colab's) sends the
whole figure as self-contained HTML in one update_display_data message, the "output" backend
re-displays the whole figure into its Output widget (all go out on the kernel's iopub socket, as in
JupyterLab and Colab). The time the browser then takes to draw is not included. Reported: median and
90th percentile of the update time in ms per widget and backend, and the median of the maths alone
(`compute`), from one run.
Goal: every median well under 100 ms. The machine is shared: compare figures of the same run.

    python -m benchmarks widgets
    python -m benchmarks.bench_widgets [--moves 40]
"""

from __future__ import annotations

import argparse
import json
import textwrap

#: median update time per slider move that the widgets must stay well under
GOAL_MS = 100.0

#: per explorer: the slider that is dragged, and the values it passes through
DRAGS = {
    "ClipExplorer": ("advantage", 1.0, -1.0),
    "GAEExplorer": ("lam", 0.3, 1.0),
    "KLExplorer": ("shift", 0.2, 2.5),
    "ValueClipExplorer": ("value", -1.0, 2.0),
}

#: runs inside the kernel: prints one JSON line {widget: {backend: {...}}}
KERNEL_CODE = textwrap.dedent("""
    import json, statistics, time
    import numpy as np
    import torch
    torch.set_num_threads(1)
    from IPython.display import display
    from rlhf_helpers import widgets

    def compute_args(explorer):
        v = explorer.values()
        if isinstance(explorer, widgets.ClipExplorer):
            return (v["eps"], v["advantage"], v["dual_clip"] if v["dual"] else None)
        if isinstance(explorer, widgets.GAEExplorer):
            return (v["gamma"], v["lam"], v["kl_coef"], v["score"], v["kl_kind"])
        if isinstance(explorer, widgets.KLExplorer):
            return (v["shift"], v["n_samples"], v["seed"])
        return (v["value_clip"], v["old_value"], v["ret"])

    results = {}
    for name, (control, lo, hi) in DRAGS.items():
        results[name] = {}
        for backend in widgets.BACKENDS:
            explorer = getattr(widgets, name)(backend=backend)
            display(explorer)  # "html" sends its updates only once its figure is shown
            slider = explorer.controls[control].slider
            values = [round(float(x), 4) for x in np.linspace(lo, hi, MOVES + WARMUP)]
            update_ms, compute_ms = [], []
            for i, value in enumerate(values):
                start = time.perf_counter()
                slider.value = value  # slider -> text box -> explorer.update()
                elapsed = time.perf_counter() - start
                start = time.perf_counter()
                explorer.compute(*compute_args(explorer))  # the maths alone, same values
                maths = time.perf_counter() - start
                if i >= WARMUP:
                    update_ms.append(1000 * elapsed)
                    compute_ms.append(1000 * maths)
            assert explorer.error is None, explorer.error
            assert explorer.updates >= MOVES, (name, backend, explorer.updates)
            update_ms.sort()
            results[name][backend] = {
                "median_ms": statistics.median(update_ms),
                "p90_ms": update_ms[int(0.9 * (len(update_ms) - 1))],
                "compute_median_ms": statistics.median(compute_ms),
            }
    print("RESULT " + json.dumps(results))
""")


def run_in_kernel(moves: int, warmup: int = 5, timeout: float = 600.0) -> dict:
    """Start a python3 kernel, run the timing code in it, return its results."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=_kernel_env())
    lines: list[str] = []
    errors: list[str] = []

    def on_output(msg: dict) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            lines.extend(content["text"].splitlines())
        elif kind == "error":
            errors.append("\n".join(content["traceback"]))

    try:
        setup = f"DRAGS = {DRAGS!r}\nMOVES = {moves}\nWARMUP = {warmup}\n"
        reply = kc.execute_interactive(setup + KERNEL_CODE, timeout=timeout, output_hook=on_output)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    if reply["content"]["status"] != "ok" or errors:
        raise RuntimeError("the benchmark failed in the kernel:\n" + "\n".join(errors))
    result = next(line for line in lines if line.startswith("RESULT "))
    return json.loads(result.removeprefix("RESULT "))


def _kernel_env() -> dict[str, str]:
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RLHF_WIDGETS_BACKEND", None)  # each explorer names its backend
    return env


def table(results: dict) -> str:
    """A markdown table: widget | median (p90) per backend | maths alone."""
    backends = list(next(iter(results.values())))
    rows = ["| widget | " + " | ".join(f"{b} median (p90)" for b in backends)
            + " | maths alone (median) |", "|---" * (len(backends) + 2) + "|"]
    for name, per_backend in results.items():
        cells = [f"{s['median_ms']:.1f} ms ({s['p90_ms']:.1f})" for s in per_backend.values()]
        maths = per_backend[backends[0]]["compute_median_ms"]
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {maths:.1f} ms |")
    return "\n".join(rows)


def main(moves: int = 40, fast: bool = False) -> dict:
    """Time `moves` slider moves per explorer and backend in a kernel; return flat figures."""
    results = run_in_kernel(moves=10 if fast else moves)
    print(table(results))
    figures: dict[str, object] = {}
    worst = 0.0
    for name, per_backend in results.items():
        short = name.removesuffix("Explorer").lower()
        for backend, stats in per_backend.items():
            for key, value in stats.items():
                figures[f"{short}.{backend}.{key}"] = value
            worst = max(worst, stats["median_ms"])
    figures["worst_median_ms"] = worst
    figures["goal_median_ms"] = GOAL_MS
    figures["goal_met"] = worst < GOAL_MS
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=40,
                        help="timed slider moves per widget and backend")
    parser.add_argument("--fast", action="store_true", help="10 moves (smoke run)")
    args = parser.parse_args()
    for key, value in main(moves=args.moves, fast=args.fast).items():
        print(f"  {key:<40} {value:.4g}" if isinstance(value, float) else f"  {key:<40} {value}")
