"""Benchmark: the run doctor is linear in the history.

Each rule runs on n and 8n rows of one synthetic history (every row's KL negative: one long stretch,
which a `negative_kl` that rebuilt its list at every row would make quadratic); a linear rule takes
about 8x the CPU time, a quadratic one 64x. Then `diagnose` reads a large metrics.jsonl end to end
(goal: a 200 MB file in well under a minute; the full size writes ~200 MB into the runs folder,
`--fast` ~20 MB). Ratios of CPU time in one run; the rows are the same.

    python -m benchmarks doctor
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from rlhf_helpers.doctor import RULES, RunFacts, Thresholds, diagnose

#: 8x the rows: a linear rule's ratio is about 8, a quadratic one's 64; 24 (three times linear)
#: tells them apart.
MAX_RATIO = 24.0

ROW = {"kl": -0.01, "score": 1.0, "score_std": 0.5, "entropy": 1.7, "clipfrac": 0.04,
       "approx_kl": 0.01, "response_length": 20.0, "explained_variance": 0.3, "hidden_score": 0.5,
       "policy_grad_norm": 0.1}

#: metrics no rule reads, so a row is about as long as a GPU run's (~800 bytes)
PADDING = {f"extra_metric_{k:02d}": 0.123456789 for k in range(25)}


def least_cpu_seconds(rule, rows: list[dict], facts: RunFacts, repeats: int) -> float:
    """The least CPU time of `repeats` runs (the run least disturbed by other work)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        rule(rows, facts, Thresholds())
        times.append(time.process_time() - start)
    return min(times)


def main(fast: bool = False) -> dict:
    """Per-rule CPU-time ratios on 8x the rows, then one large file end to end; print and return the
    figures."""
    n = 2_000 if fast else 4_000
    rows = [{"step": i + 1, **ROW} for i in range(8 * n)]
    facts = RunFacts(total_steps=8 * n)
    ratios = {}
    for rule in RULES:
        if rule.on_folder:  # reads a run folder's checkpoints, not the rows
            continue
        small = least_cpu_seconds(rule.check, rows[:n], facts, repeats=3)
        large = least_cpu_seconds(rule.check, rows, facts, repeats=2)
        ratios[rule.name] = large / max(small, 1e-4)
    worst = max(ratios, key=ratios.get)
    print(f"CPU time on {8 * n} rows over {n} rows, per rule (linear ~8, quadratic ~64):")
    for name, ratio in sorted(ratios.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<28}{ratio:>8.1f}x")

    lines = 25_000 if fast else 250_000
    folder = Path(tempfile.mkdtemp(dir=os.environ.get("RLHF_RUNS_DIR")))
    path = folder / "metrics.jsonl"
    with path.open("w") as out:
        for i in range(1, lines + 1):
            row = {"step": i, **ROW, "kl": -0.01 if lines // 5 <= i < 3 * lines // 5 else 0.5}
            out.write(json.dumps({**row, **PADDING}) + "\n")  # ~800 bytes a row, like a GPU run's
    megabytes = path.stat().st_size / 1e6
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    found = {f.rule for f in diagnose(folder).findings}
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    path.unlink()
    folder.rmdir()
    if "negative_kl" not in found:  # a wrong verdict is a failure; a slow one only misses the goal
        print("FAILED: negative_kl not found in the large file")
    verdict = "meets" if ratios[worst] <= MAX_RATIO else "MISSES"
    print(f"diagnose on a {megabytes:.0f} MB metrics.jsonl: {wall:.1f} s wall, {cpu:.1f} s CPU")
    print(f"{verdict} the goal: every rule at most {MAX_RATIO:.0f}x on 8x the rows (worst {worst})")
    return {"rows_small": n, "worst_rule": worst, "worst_ratio": ratios[worst],
            "max_ratio": MAX_RATIO,
            "file_mb": megabytes, "diagnose_wall_s": wall, "diagnose_cpu_s": cpu}

if __name__ == "__main__":
    main()
