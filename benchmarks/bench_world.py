"""Benchmark of the offline world: rebuild the tiny model from scratch and measure it.

Reports the wall time of the full rebuild (data + pretraining + SFT; goal: under 180 s on the
2-core CI machine), the parameter count and size on disk, and the quality of the model's samples
on held-out prompts next to the corpus: hidden-score distribution, fraction ending in EOS,
distinct-1/2. Timings on a shared machine are noisy; compare runs taken on the same machine.

    python -m benchmarks.bench_world [--fast]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

#: Goal for the full rebuild on 2 CPU cores, in seconds.
GOAL_SECONDS = 180.0


def main(fast: bool = False) -> dict:
    """Rebuild everything in a temporary directory; return the measured figures."""
    import torch

    from rlhf_helpers.world.build import FAST_SIZES, build_data, build_model

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.perf_counter()
        data_stats = build_data(out, seed=0, sizes=FAST_SIZES if fast else None)
        data_seconds = time.perf_counter() - start
        log = build_model(out, seed=0, fast=fast)
        total = time.perf_counter() - start
    samples, corpus = log["samples"], log["corpus"]
    return {
        "fast": fast,
        "torch_threads": torch.get_num_threads(),
        "data_seconds": data_seconds,
        "model_seconds": log["build_seconds"],
        "rebuild_seconds": total,
        "rebuild_over_goal": total / GOAL_SECONDS,
        "n_parameters": log["n_parameters"],
        "size_on_disk_mb": log["size_on_disk_bytes"] / 1e6,
        "sample_score_mean": samples["score_mean"],
        "corpus_score_mean": corpus["score_mean"],
        "sample_score_std": samples["score_std"],
        "corpus_score_std": corpus["score_std"],
        "sample_eos_fraction": samples["eos_fraction"],
        "sample_distinct_2": samples["distinct_2"],
        "corpus_distinct_2": corpus["distinct_2"],
        "accuracy_ceiling_train": data_stats["preferences_train"]["accuracy_ceiling"],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Rebuild the tiny model and measure it.")
    parser.add_argument("--fast", action="store_true", help="few training steps (smoke run)")
    print(json.dumps(main(parser.parse_args().fast), indent=2))
