"""Our shared-LoRA PPO engine side by side with trl==1.10.0's `trl.experimental.ppo.PPOTrainer`.

Both run in one call, one after the other, each in its own subprocess with one torch thread, on
the same model, prompts, batch size, response length, epochs, minibatches, learning rate, KL
coefficient, clip ranges, LoRA rank and reward:

- TRL: inside a separate venv `.bench-venv-trl110/` (TRL 1.16 in .venv has no PPOTrainer),
  built here on first use from `benchmarks/requirements-trl-baseline.txt`.
- ours: `rlhf_helpers.ppo` in the main venv.

Reported: wall time and CPU time per PPO update (rollout + all update epochs; median after the
warm-up updates; goal: ours at least 3x faster), peak RSS (and peak CUDA memory on a GPU), and
the hidden ground-truth score of samples on held-out prompts at a matched KL to the reference
(`score_at_kl`: the best score each side's evaluation curve reaches within the KL budget both
sides reached). Timings on a shared machine are noisy; compare ratios from one run.

    python -m benchmarks.bench_trl_baseline                  # tiny profile, CPU, ~4 minutes
    python -m benchmarks.bench_trl_baseline --fast           # smoke run
    python -m benchmarks.bench_trl_baseline --device cuda --random-init-config smollm2

Honest differences: TRL's PPOTrainer keeps separate policy, value and reward models (its value
model is a full fine-tuned copy; the reference is the policy with its LoRA adapter disabled);
ours keeps one base with policy and value adapters. TRL sums policy and value loss into one
AdamW step and does not clip gradients; ours steps one Adam per adapter and clips each
gradient norm at 1.0. Both use the hidden scorer as the reward, so neither pays for a
reward-model forward. benchmarks/README.md has the full list and the latest figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.trl_baseline.common import BenchSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The separate venv with trl==1.10.0 (gitignored by `.bench-venv*/`).
VENV_DIR = REPO_ROOT / ".bench-venv-trl110"
REQUIREMENTS = REPO_ROOT / "benchmarks" / "requirements-trl-baseline.txt"
RUNNERS = REPO_ROOT / "benchmarks" / "trl_baseline"
SPEEDUP_GOAL = 3.0  #: ours vs TRL, s per update (wall and CPU), on the CPU
CUDA_SPEEDUP_GOAL = 4.0  #: the same on a GPU (anchor: TRL 1.10 at 7.59 s/update on an H100)
CUDA_MEMORY_GOAL = 0.3  #: peak CUDA memory, ours over TRL, on a GPU
#: Longest a side may run before it is stopped, in seconds.
#: seconds one side may run
SIDE_TIMEOUT_S = int(os.environ.get("RLHF_BENCH_SIDE_TIMEOUT_S", "900"))
VENV_BUILD_TIMEOUT_S = 1200


def _requirements_digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


#: A folder holding trl==1.10.0 (pip install --target): the TRL side then runs with this Python and
#: that folder first on its path, and no venv is built (a GPU machine with no package index).
TRL_SITE_ENV = "RLHF_TRL110_SITE"


def ensure_venv(venv: Path = VENV_DIR, python: str | None = None) -> tuple[Path | None, str]:
    """The venv's python, building the venv if it is missing or its pins changed.

    Returns (python path, "") or (None, why it could not be built). A stamp file holds the
    hash of the requirements it was built from. With $RLHF_TRL110_SITE set, this Python.
    """
    if os.environ.get(TRL_SITE_ENV):
        return Path(sys.executable), ""
    venv_python = venv / "bin" / "python"
    stamp = venv / ".requirements.sha256"
    if venv_python.exists() and stamp.exists() and stamp.read_text() == _requirements_digest():
        return venv_python, ""
    base_python = python or shutil.which("python3") or sys.executable
    print(f"building {venv} (trl==1.10.0; takes a minute or two, once)...", flush=True)
    try:
        if venv.exists():
            shutil.rmtree(venv)
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True, capture_output=True,
                       text=True, timeout=120)
        subprocess.run(
            [str(venv_python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)],
            check=True, capture_output=True, text=True, timeout=VENV_BUILD_TIMEOUT_S)
        subprocess.run([str(venv_python), "-c", "from trl.experimental.ppo import PPOTrainer"],
                       check=True, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", None) or str(error)
        return None, f"could not build the trl==1.10.0 venv: {detail.strip()[-600:]}"
    stamp.write_text(_requirements_digest())
    return venv_python, ""


def settings_from_profile(fast: bool, device: str, random_init_config: str | None) -> BenchSettings:
    """Matched settings from the course profile: tiny, or gpu for a random-init run.

    A random-init SmolLM2-architecture run uses the gpu profile's sizes and LoRA targets; on a
    CPU only `fast=True` is practical (tiny batches, short responses: a code-path check).
    """
    from rlhf_helpers.runtime.profiles import get_profile

    profile = get_profile("gpu" if device == "cuda" or random_init_config else "tiny")
    settings = BenchSettings(
        batch_size=profile.ppo.rollout_batch_size,
        mini_batch_size=profile.ppo.mini_batch_size,
        ppo_epochs=profile.ppo.ppo_epochs,
        response_length=profile.ppo.max_new_tokens,
        max_prompt_length=profile.ppo.max_prompt_length,
        learning_rate=profile.ppo.policy_lr,
        kl_coef=profile.ppo.kl_coef,
        clip_eps=profile.ppo.clip_eps,
        value_clip=profile.ppo.value_clip if profile.ppo.value_clip is not None else 1e9,
        gamma=profile.ppo.gamma,
        lam=profile.ppo.lam,
        temperature=profile.ppo.temperature,
        lora_r=profile.lora.r,
        lora_alpha=profile.lora.alpha,
        lora_target_modules=list(profile.lora.target_modules),
        seed=profile.seed,
        device=device,
        dtype="bfloat16" if device == "cuda" else "float32",
        random_init_config=random_init_config,
    )
    if device == "cuda":
        # the GPU anchor: trl 1.10's PPOTrainer took 7.59 s per update and 7.69 GiB here on
        # an H100 with a SmolLM2-135M-size Llama in bf16, 32 prompts x 64 tokens, 4 epochs x 2
        # minibatches
        settings.batch_size, settings.mini_batch_size, settings.response_length = 32, 16, 64
        settings.ppo_epochs = 4
        settings.n_eval_prompts = 128
        # 6 updates (median of the last 5) and 3 evaluations: about a minute of TRL's time, so the
        # whole stage fits one call of a lent GPU's 10-minute limit
        settings.updates, settings.warmup_updates, settings.eval_every = 6, 1, 3
    if fast:
        settings.updates, settings.warmup_updates, settings.eval_every = 3, 1, 3
        settings.batch_size, settings.mini_batch_size, settings.n_eval_prompts = 16, 8, 16
        if random_init_config and device == "cpu":
            settings.batch_size, settings.mini_batch_size, settings.n_eval_prompts = 4, 2, 4
            settings.response_length, settings.ppo_epochs = 8, 1
    return settings.validate()


def run_side(python: Path | str, script: Path, settings: BenchSettings, workdir: Path,
             timeout_s: int = SIDE_TIMEOUT_S) -> dict[str, Any]:
    """Run one side in its own process; its JSON of figures, or {"error": ...}."""
    out = workdir / f"{script.stem}.json"
    path = [str(REPO_ROOT)]
    if script.stem == "run_trl_ppo" and os.environ.get(TRL_SITE_ENV):
        path.insert(0, os.environ[TRL_SITE_ENV])
    path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", WANDB_DISABLED="true", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(settings.torch_threads), PYTHONWARNINGS="ignore")
    command = [str(python), str(script), "--settings", settings.to_json(), "--out", str(out)]
    log = workdir / f"{script.stem}.log"
    # the side's output goes to a file, so a side stopped by the timeout still shows how far it got
    try:
        with log.open("w") as sink:
            done = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=sink,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"{script.name} ran past {timeout_s} s; its last output:\n{_tail(log)}"}
    if done.returncode != 0 or not out.exists():
        return {"error": f"{script.name} exited {done.returncode}: {_tail(log)}"}
    return json.loads(out.read_text())


def _tail(path: Path, chars: int = 1500) -> str:
    return path.read_text(errors="replace").strip()[-chars:] if path.exists() else ""


def score_at_kl(curve: Sequence[dict[str, float]], target_kl: float) -> float | None:
    """Best hidden score the run reached while its KL to the reference stayed <= target_kl.

    The evaluations, in update order, are joined by straight lines; the answer is the highest
    score on that polyline inside KL <= target_kl: the evaluated points there and the points where
    a segment crosses KL = target_kl (linear interpolation). None if no point is inside.
    """
    points = [(p["kl"], p["hidden_score"]) for p in curve]
    if not points:
        raise ValueError("curve must have at least one evaluation")
    inside = [score for kl, score in points if kl <= target_kl]
    for (kl0, s0), (kl1, s1) in zip(points, points[1:], strict=False):
        if min(kl0, kl1) < target_kl < max(kl0, kl1):
            inside.append(s0 + (s1 - s0) * (target_kl - kl0) / (kl1 - kl0))
    return max(inside) if inside else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def compare(trl: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Ratios and the matched-KL scores of two finished sides.

    The matched KL is the smaller of the two sides' largest evaluated KLs: the largest budget
    both sides reached, so neither is credited for drifting further from the reference.
    """
    matched_kl = min(max(p["kl"] for p in trl["evals"]), max(p["kl"] for p in ours["evals"]))
    on_cuda = "peak_cuda_memory_mb" in trl
    memory_key = "peak_cuda_memory_mb" if on_cuda else "peak_rss_mb"
    speedup_goal = CUDA_SPEEDUP_GOAL if on_cuda else SPEEDUP_GOAL
    comparison = {
        "speedup_ours_vs_trl": _ratio(trl["seconds_per_update"], ours["seconds_per_update"]),
        "cpu_speedup_ours_vs_trl": _ratio(trl.get("cpu_seconds_per_update"),
                                          ours.get("cpu_seconds_per_update")),
        "speedup_goal": speedup_goal,
        "memory_metric": memory_key,
        "peak_memory_ratio_ours_over_trl": _ratio(ours.get(memory_key), trl.get(memory_key)),
        "training_memory_ratio_ours_over_trl": _ratio(
            ours["peak_rss_mb"] - ours["rss_after_imports_mb"],
            trl["peak_rss_mb"] - trl["rss_after_imports_mb"]),
        "matched_kl": matched_kl,
        "trl_score_at_matched_kl": score_at_kl(trl["evals"], matched_kl),
        "ours_score_at_matched_kl": score_at_kl(ours["evals"], matched_kl),
    }
    # conservative verdict: a busy machine can inflate the wall ratio (the sides run one after the
    # other, under whatever load there is), so the goal counts as met only if CPU time agrees
    speedups = [comparison["speedup_ours_vs_trl"], comparison["cpu_speedup_ours_vs_trl"]]
    known = [x for x in speedups if x is not None]
    comparison["speedup_goal_met"] = bool(known) and min(known) >= speedup_goal
    if on_cuda:
        ratio = comparison["peak_memory_ratio_ours_over_trl"]
        comparison["memory_goal"] = CUDA_MEMORY_GOAL
        comparison["memory_goal_met"] = ratio is not None and ratio <= CUDA_MEMORY_GOAL
    return comparison


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return format(value, spec)


def format_table(trl: dict[str, Any], ours: dict[str, Any], comparison: dict[str, Any]) -> str:
    """Plain-text table: one row per figure, TRL | ours | ours/TRL."""
    rows = [("wall s per PPO update (median)", "seconds_per_update"),
            ("CPU s per PPO update (median)", "cpu_seconds_per_update"),
            ("tokens/s (batch x resp. len / s)", "tokens_per_second"),
            ("peak RSS, MB", "peak_rss_mb"),
            ("RSS after imports, MB", "rss_after_imports_mb"),
            ("trainable parameters", "trainable_parameters")]
    if "peak_cuda_memory_mb" in trl or "peak_cuda_memory_mb" in ours:
        rows.append(("peak CUDA memory, MB", "peak_cuda_memory_mb"))
    lines = [f"{'figure':34} {'TRL 1.10':>12} {'ours':>12} {'ours/TRL':>10}"]
    for label, key in rows:
        a, b = trl.get(key), ours.get(key)
        lines.append(f"{label:34} {_fmt(a):>12} {_fmt(b):>12} {_fmt(_ratio(b, a)):>10}")
    a, b = trl["evals"][-1], ours["evals"][-1]
    lines.append(f"{'final held-out KL':34} {_fmt(a['kl']):>12} {_fmt(b['kl']):>12}")
    lines.append(f"{'final held-out hidden score':34} {_fmt(a['hidden_score']):>12} "
                 f"{_fmt(b['hidden_score']):>12}")
    if "hidden_score_se" in a and "hidden_score_se" in b:
        lines.append(f"{'  its standard error':34} {_fmt(a['hidden_score_se'], '.2f'):>12} "
                     f"{_fmt(b['hidden_score_se'], '.2f'):>12}")
    label = f"hidden score at KL {comparison['matched_kl']:.3g}"
    lines.append(f"{label:34} {_fmt(comparison['trl_score_at_matched_kl']):>12} "
                 f"{_fmt(comparison['ours_score_at_matched_kl']):>12}")
    speedup = comparison["speedup_ours_vs_trl"]
    lines.append(f"speed-up ours vs TRL: {_fmt(speedup)}x wall, "
                 f"{_fmt(comparison.get('cpu_speedup_ours_vs_trl'))}x CPU (goal >= "
                 f"{comparison['speedup_goal']}x in both: "
                 f"{'met' if comparison['speedup_goal_met'] else 'not met'})")
    if "memory_goal" in comparison:
        lines.append(
            f"peak CUDA memory ours/TRL: {_fmt(comparison['peak_memory_ratio_ours_over_trl'])} "
            f"(goal <= {comparison['memory_goal']}: "
            f"{'met' if comparison['memory_goal_met'] else 'not met'})")
    return "\n".join(lines)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The flat figures `python -m benchmarks` prints: per side, then the comparison."""
    figures: dict[str, Any] = {}
    keys = ("seconds_per_update", "cpu_seconds_per_update", "tokens_per_second", "peak_rss_mb",
            "rss_after_imports_mb", "peak_cuda_memory_mb", "trainable_parameters")
    for side in ("trl", "ours"):
        if side not in result:
            continue
        figures.update({f"{side}_{key}": result[side][key] for key in keys if key in result[side]})
        final = result[side]["evals"][-1]
        figures[f"{side}_final_kl"] = final["kl"]
        figures[f"{side}_final_hidden_score"] = final["hidden_score"]
    figures.update(result.get("comparison", {}))
    return figures


def main(fast: bool = False, device: str = "cpu", random_init_config: str | None = None,
         only: str | None = None, json_path: Path | None = None) -> dict[str, Any]:
    """Build the venv if needed, run both sides, print the table; return the flat figures.

    `only`: "trl" or "ours" runs one side (for debugging). `json_path`: also write every figure
    (settings, per-update times, evaluation curves, training logs) there. Returns
    {"skipped": reason} when the trl==1.10.0 venv cannot be built (no package index, for
    instance); raises RuntimeError when a side fails.
    """
    if only not in (None, "trl", "ours"):
        raise ValueError(f"only must be None, 'trl' or 'ours', got {only!r}")
    if device == "cuda" and random_init_config is None:
        raise ValueError(
            "device='cuda' needs random_init_config (e.g. 'smollm2'): no hub weights here")
    settings = settings_from_profile(fast, device, random_init_config)
    result: dict[str, Any] = {"settings": settings.__dict__}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if only in (None, "trl"):
            venv_python, why = ensure_venv()
            if venv_python is None:
                print(f"SKIPPED: {why}")
                return {"skipped": why}
            print("running TRL 1.10 PPOTrainer...", flush=True)
            result["trl"] = run_side(venv_python, RUNNERS / "run_trl_ppo.py", settings, workdir)
        if only in (None, "ours"):
            print("running our engine...", flush=True)
            result["ours"] = run_side(sys.executable, RUNNERS / "run_ours_ppo.py",
                                      settings, workdir)
    errors = {side: result[side]["error"] for side in ("trl", "ours")
              if side in result and "error" in result[side]}
    if only is None and not errors:
        result["comparison"] = compare(result["trl"], result["ours"])
        print(format_table(result["trl"], result["ours"], result["comparison"]))
    if json_path is not None:
        Path(json_path).write_text(json.dumps(result, indent=2))
    if errors:
        raise RuntimeError(
            "; ".join(f"{side} failed: {message}" for side, message in errors.items()))
    figures = summarize(result)
    if only is not None:
        print("\n".join(f"{key:34} {_fmt(value)}" for key, value in figures.items()))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Our PPO engine vs trl==1.10.0's PPOTrainer.")
    parser.add_argument("--fast", action="store_true", help="3 small updates per side (smoke run)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--random-init-config", choices=("smollm2",), default=None,
                        help="random weights of this architecture (needed with --device cuda)")
    parser.add_argument("--only", choices=("trl", "ours"), default=None, help="run one side")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    cli = parser.parse_args()
    main(cli.fast, cli.device, cli.random_init_config, cli.only, cli.json)
