"""One PPO run with our shared-LoRA engine (`rlhf_helpers.ppo`); writes a JSON of figures.

The counterpart of `run_trl_ppo.py`, run in the main .venv by `benchmarks/bench_trl_baseline.py`
with the same `BenchSettings`:

    python benchmarks/trl_baseline/run_ours_ppo.py --settings '{"updates": 12}' --out /tmp/ours.json

One base model with `policy` and `value` LoRA adapters (the reference is the base with adapters
disabled); the reward is the same hidden ground-truth scorer TRL gets, passed as `reward_fn`.
Time per update is the wall time of `PPOTrainer.step()` (rollouts + all update epochs);
held-out evaluations run between steps and are not timed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root, when run as a script

from benchmarks.trl_baseline.common import (  # noqa: E402
    BenchSettings,
    TrainingPeak,
    UpdateClock,
    current_rss_mb,
    evaluate,
    hidden_score_texts,
    load_model,
    load_prompt_texts,
    load_tokenizer,
    median,
    peak_rss_mb,
    write_json,
)


def engine_config(settings: BenchSettings) -> Any:
    """Our PPOConfig with the benchmark's matched settings."""
    from rlhf_helpers.runtime.lora import LoRASpec
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    return PPOConfig(
        rollout_batch_size=settings.batch_size,
        mini_batch_size=settings.mini_batch_size,
        ppo_epochs=settings.ppo_epochs,
        max_prompt_length=settings.max_prompt_length,
        max_new_tokens=settings.response_length,
        temperature=settings.temperature,
        clip_eps=settings.clip_eps,
        value_clip=settings.value_clip,
        vf_coef=settings.vf_coef,
        kl_coef=settings.kl_coef,
        kl_kind="k1",
        gamma=settings.gamma,
        lam=settings.lam,
        policy_lr=settings.learning_rate,
        value_lr=settings.learning_rate,
        value_warmup_steps=0,  # TRL's PPOTrainer has no critic-only warm-up
        lora=LoRASpec(r=settings.lora_r, alpha=settings.lora_alpha,
                      target_modules=tuple(settings.lora_target_modules)),
        total_steps=settings.updates,
        seed=settings.seed,
        progress_bar=False,
    )


def build_engine(settings: BenchSettings, base: Any, tokenizer: Any,
                 train_prompts: list[str]) -> Any:
    """Our shared model on `base` and its PPOTrainer as this benchmark runs them (hidden score as
    reward)."""
    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.ppo.trainer import PPOTrainer

    config = engine_config(settings)
    model = SharedLoRAModel(base, tokenizer.pad_token_id, tokenizer.eos_token_id,
                            seed=settings.seed, lora=config.lora)
    return PPOTrainer(config, model, tokenizer, train_prompts, reward_fn=hidden_score_texts,
                      hidden_score_fn=None)


def main(settings: BenchSettings, out: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(settings.torch_threads)
    torch.manual_seed(settings.seed)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import peft  # noqa: F401  (imported before the RSS baseline, as TRL's side has it imported too)
    import transformers
    from transformers import AutoModelForCausalLM

    from rlhf_helpers.ppo.model.sampling import sample_model

    if settings.lora_r < 1:
        raise ValueError("our engine trains LoRA adapters only: lora_r must be >= 1")
    rss_after_imports = current_rss_mb()
    tokenizer = load_tokenizer(settings)
    train_prompts = load_prompt_texts("train")
    eval_prompts = load_prompt_texts("test", settings.n_eval_prompts)
    base = load_model(settings, AutoModelForCausalLM, tokenizer)
    trainer = build_engine(settings, base, tokenizer, train_prompts)
    model = trainer.model
    rss_after_setup = current_rss_mb()

    def run_eval(update: int) -> dict[str, float]:
        result = evaluate(
            tokenizer, eval_prompts, settings,
            lambda ids, mask: sample_model(model, ids, mask, settings.response_length,
                                             temperature=settings.temperature).sequences,
            model.policy_logprobs, model.ref_logprobs)
        return {"update": update, **result}

    clock = UpdateClock()
    evals = [run_eval(0)]
    train_logs: list[dict[str, float]] = []
    peak = TrainingPeak() if settings.device == "cuda" else None
    if peak:
        peak.start()
    start = time.perf_counter()
    for update in range(1, settings.updates + 1):
        clock.resume()
        metrics = trainer.step()
        if settings.device == "cuda":
            torch.cuda.synchronize()
        clock.update_done()
        train_logs.append({"kl": metrics["kl"], "score": metrics["score"],
                           "clipfrac": metrics.get("clipfrac"),
                           "approxkl": metrics.get("approx_kl"),
                           "time_rollout": metrics.get("time_rollout"),
                           "time_update": metrics.get("time_update")})
        if update % settings.eval_every == 0 or update == settings.updates:
            if peak:
                peak.pause()
            evals.append(run_eval(update))
            if peak:
                peak.resume()
    train_seconds = time.perf_counter() - start
    per_update = median(clock.seconds[settings.warmup_updates:])
    trainable = model.policy_parameters() + model.value_parameters()
    result: dict[str, Any] = {
        "side": "ours",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "settings": settings.__dict__,
        "update_seconds": clock.seconds,
        "update_cpu_seconds": clock.cpu_seconds,
        "cpu_seconds_per_update": median(clock.cpu_seconds[settings.warmup_updates:]),
        "seconds_per_update": per_update,
        "train_seconds": train_seconds,
        "tokens_per_second": settings.batch_size * settings.response_length / per_update,
        "rss_after_imports_mb": rss_after_imports,
        "rss_after_setup_mb": rss_after_setup,
        "peak_rss_mb": peak_rss_mb(),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "evals": evals,
        "train_logs": train_logs,
    }
    if peak:
        peak.finish()
        result["peak_cuda_memory_mb"] = peak.peak / 1e6  # the updates alone
        result["peak_cuda_memory_with_evaluations_mb"] = peak.peak_with_evaluations / 1e6
    write_json(out, result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="{}", help="BenchSettings fields as JSON")
    parser.add_argument("--out", required=True, type=Path,
                        help="where to write the JSON of figures")
    cli = parser.parse_args()
    main(BenchSettings.from_json(cli.settings), cli.out)
