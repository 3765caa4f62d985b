"""The gpu-profile test's run (tests/stages/test_gpu_paths.py) under numeric variants of this CPU.

Usage:
    python tools/gpu_test_variants.py bfloat16                       # every variant
    python tools/gpu_test_variants.py float16 --variants native,all-three
    python tools/gpu_test_variants.py bfloat16 --overrides '{"kl_coef": 0.05}'   # another setting

Each variant (tools/claim_margins.py's, plus `pinned-avx2`: every library pinned to AVX2, the pin
an Intel AVX-512 machine can share with an AMD AVX2 one) trains the test's model in folders of its
own and prints the KL, learned and hidden score of every step, the doctor's findings and the
quantities the test asserts: whether the test's premise (a healthy run) holds whatever the rounding.
"""

from __future__ import annotations

# ruff: noqa: E402 - run as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("tools/gpu_test_variants.py")

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "stages"),
                str(ROOT / "tools")]

from claim_margins import available_variants  # noqa: E402
from test_gpu_paths import OVERRIDES, STEPS  # noqa: E402

from rlhf_helpers.runtime.interrupt import one_line_interrupt  # noqa: E402

PINNED_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def run(variant: dict[str, str], dtype: str, overrides: dict) -> tuple[list[dict], dict]:
    """One training run of the test under `variant`: (its metrics rows, its diagnosis)."""
    root = Path(tempfile.mkdtemp(prefix="gpu-test-variant-"))
    env = {**os.environ, **variant,
           "RLHF_PROFILE_OVERRIDES": json.dumps({**OVERRIDES, **overrides, "dtype": dtype}),
           "RLHF_CACHE_DIR": str(root / "cache"), "RLHF_RUNS_DIR": str(root / "runs"),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "rlhf_helpers.stages.train_ppo", "--profile", "gpu", "--steps",
         str(STEPS), "--eval-every", "10", "--output-dir", str(root / "run"),
         "--no-progress-bar"], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return rows, json.loads((root / "run" / "diagnosis.json").read_text())


@one_line_interrupt("tools/gpu_test_variants.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The gpu-profile test's run under numeric "
                                                 "variants of this CPU.")
    parser.add_argument("dtype", choices=["bfloat16", "float16"])
    parser.add_argument("--variants", default="", help="comma-separated names (default: all)")
    parser.add_argument("--overrides", default="{}", help="JSON settings over the test's")
    args = parser.parse_args(argv)
    variants = {**available_variants(), "pinned-avx2": PINNED_AVX2}
    chosen = [v for v in args.variants.split(",") if v] or list(variants)
    unknown = [v for v in chosen if v not in variants]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; this machine has {list(variants)}")
    for name in chosen:
        rows, diagnosis = run(variants[name], args.dtype, json.loads(args.overrides))
        findings = [(f["rule"], f["severity"]) for f in diagnosis["findings"]]

        def mean(key, part):
            return sum(r[key] for r in part) / len(part)

        print(f"== {name} {args.dtype}: findings {findings}")
        for key in ("kl", "score", "hidden_score"):
            print(f"  {key:<13}" + " ".join(f"{r[key]:.2f}" for r in rows))
        print(f"  score rise {mean('score', rows[-5:]) - mean('score', rows[:5]):.3f}, explained "
              f"variance {mean('explained_variance', rows[-5:]):.3f}, max KL "
              f"{max(r['kl'] for r in rows):.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
