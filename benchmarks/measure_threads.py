"""How many torch threads the tiny profile's PPO update wants, alone and beside a busy process.

    python -m benchmarks.measure_threads              # 1, 2 and torch's default, quiet and loaded
    python -m benchmarks.measure_threads --updates 2  # shorter

Each case is a fresh process that builds bench_trl_baseline's tiny-profile trainer, sets its thread
count (torch.set_num_threads and OMP_NUM_THREADS), runs 2 warm-up PPO iterations, then times
`--updates` more: wall seconds and process CPU seconds per iteration (rollout and update). "Loaded"
runs one other process beside it for the whole case: a single-threaded loop of float32 matrix
products, what a second training run, a notebook kernel or a test worker puts on a shared core.
OpenMP threads spin-wait at each parallel region for the slowest thread, so a thread whose core is
taken by another process holds up all of them. Not a `bench_*` module: it reports no goal; the
commands' default (`rlhf_helpers.runtime.threads`) was chosen from its figures
(benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CASE = """
import json, os, sys, time
import torch
threads = int(sys.argv[1])
if threads > 0:
    torch.set_num_threads(threads)
from benchmarks.profile_ppo_step import build_trainer
trainer = build_trainer(updates=2 + int(sys.argv[2]))
for _ in range(2):
    trainer.step()
wall, cpu = time.perf_counter(), time.process_time()
for _ in range(int(sys.argv[2])):
    trainer.step()
n = int(sys.argv[2])
print(json.dumps({"threads": torch.get_num_threads(), "wall_s": (time.perf_counter() - wall) / n,
                  "cpu_s": (time.process_time() - cpu) / n}))
"""

_BUSY = """
import torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
while True:
    a = torch.tanh(a @ a * 0.01)
"""


def run_case(threads: int, updates: int, loaded: bool) -> dict[str, float]:
    """One fresh process: `threads` torch threads (0: torch's default), optionally beside a busy
    one."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore",
               TOKENIZERS_PARALLELISM="false")
    env.pop("OMP_NUM_THREADS", None)
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    busy = None
    if loaded:
        busy = subprocess.Popen([sys.executable, "-c", _BUSY], env=dict(env, OMP_NUM_THREADS="1"))
        time.sleep(1.0)  # the busy loop is running before the case starts
    try:
        out = subprocess.run([sys.executable, "-c", _CASE, str(threads), str(updates)], env=env,
                             cwd=ROOT, capture_output=True, text=True, check=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=4,
                        help="timed PPO iterations per case (after 2 warm-up)")
    cli = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    print(f"{os.cpu_count()} CPUs; tiny profile, wall and CPU seconds per PPO iteration")
    for loaded in (False, True):
        for threads in (1, 2, 0):
            case = run_case(threads, cli.updates, loaded)
            name = (f"{'loaded' if loaded else 'quiet'}, {'default' if threads == 0 else threads} "
                    "thread(s)")
            results[name] = case
            print(f"  {name:<28} torch threads {case['threads']}: wall {case['wall_s']:.2f} s, "
                  f"CPU {case['cpu_s']:.2f} s")
    return results


if __name__ == "__main__":
    main()
