"""One PPO run with trl==1.10.0's `trl.experimental.ppo.PPOTrainer`; writes a JSON of figures.

Runs INSIDE the benchmark venv (.bench-venv-trl110/, built by `benchmarks/bench_trl_baseline.py`)
with the repository root on PYTHONPATH (for the shared settings and the hidden scorer):

    PYTHONPATH=. .bench-venv-trl110/bin/python benchmarks/trl_baseline/run_trl_ppo.py \
        --settings '{"updates": 12}' --out /tmp/trl.json

TRL's design, as its PPOTrainer requires: a policy (here with a LoRA adapter, so the reference
is the policy with the adapter disabled), a separate full value model and a separate reward
model, both `AutoModelForSequenceClassification(num_labels=1)`-shaped. Time per update is the
wall time between two `on_step_end` callbacks (TRL calls it once per rollout batch), with the
held-out evaluation done inside the callback taken out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root, when run as a script

from benchmarks.trl_baseline.common import (  # noqa: E402
    BenchSettings,
    TrainingPeak,
    UpdateClock,
    causal_lm_logprobs,
    current_rss_mb,
    decode_pairs,
    evaluate,
    hidden_score_texts,
    load_model,
    load_prompt_texts,
    load_tokenizer,
    median,
    peak_rss_mb,
    write_json,
)


def build_hidden_reward_model(tokenizer: Any, context_length: int) -> Any:
    """The hidden ground-truth scorer dressed as the reward model TRL's `get_reward` calls.

    `get_reward` runs `getattr(model, model.base_model_prefix)(input_ids=...)`, applies
    `model.score` to the last hidden state and reads it at the last real token. Our backbone
    decodes each row (prompt = the first `context_length` tokens, which every batch has because
    prompts are padded to one fixed length) and returns the hidden score at every position.
    """
    import torch
    from torch import nn

    class HiddenScoreBackbone(nn.Module):
        def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
            prompts, responses = decode_pairs(tokenizer, input_ids, context_length)
            scores = torch.tensor(hidden_score_texts(prompts, responses),
                                  device=input_ids.device)  # (B,)
            per_position = scores[:, None, None].expand(*input_ids.shape, 1)  # (B, T, 1)
            return SimpleNamespace(hidden_states=(per_position,))

    class HiddenScoreRewardModel(nn.Module):
        base_model_prefix = "backbone"

        def __init__(self) -> None:
            super().__init__()
            self.backbone = HiddenScoreBackbone()
            self.score = nn.Identity()

    return HiddenScoreRewardModel()


def main(settings: BenchSettings, out: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(settings.torch_threads)
    torch.manual_seed(settings.seed)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_DISABLED", "true")
    import datasets
    import transformers
    import trl
    from peft import LoraConfig
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        TrainerCallback,
    )
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    datasets.disable_progress_bars()
    rss_after_imports = current_rss_mb()
    tokenizer = load_tokenizer(settings)

    # Prompts padded (left) to one fixed length: TRL reads the response after the query columns,
    # and the hidden-score reward needs that boundary (costs at most a pad token or two).
    train_prompts = load_prompt_texts("train")
    eval_prompts = load_prompt_texts("test", settings.n_eval_prompts)
    lengths = [len(ids) for ids in tokenizer(train_prompts)["input_ids"]]
    context_length = min(max(lengths), settings.max_prompt_length)
    encoded = tokenizer(train_prompts, padding="max_length", truncation=True,
                        max_length=context_length, padding_side="left")
    train_dataset = datasets.Dataset.from_dict({"input_ids": encoded["input_ids"]})

    policy = load_model(settings, AutoModelForCausalLM, tokenizer)
    value_model = load_model(settings, AutoModelForSequenceClassification, tokenizer, seed_offset=1,
                             num_labels=1)
    if settings.reward == "hidden":
        reward_model = build_hidden_reward_model(tokenizer, context_length)
    else:
        reward_model = AutoModelForSequenceClassification.from_pretrained(
            settings.reward, num_labels=1, dtype=getattr(torch, settings.dtype)).eval()
    peft_config = None
    ref_model = None
    if settings.lora_r > 0:
        peft_config = LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha,
                                 lora_dropout=0.0,
                                 target_modules=list(settings.lora_target_modules),
                                 task_type="CAUSAL_LM")
    else:
        ref_model = load_model(settings, AutoModelForCausalLM, tokenizer)

    args = PPOConfig(
        output_dir=str(out.parent / "trl-ppo-output"),
        # with grad accumulation 1: the rollout batch
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=1,  # TRL accumulates across minibatches when > 1
        num_mini_batches=settings.batch_size // settings.mini_batch_size,
        num_ppo_epochs=settings.ppo_epochs,
        local_rollout_forward_batch_size=settings.batch_size,
        total_episodes=settings.updates * settings.batch_size,
        response_length=settings.response_length,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        kl_coef=settings.kl_coef,
        kl_estimator="k1",
        cliprange=settings.clip_eps,
        cliprange_value=settings.value_clip,
        vf_coef=settings.vf_coef,
        gamma=settings.gamma,
        lam=settings.lam,
        temperature=settings.temperature,
        stop_token="eos",
        num_sample_generations=0,
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=settings.device == "cpu",
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=settings.seed,
    )
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy, ref_model=ref_model,
                         reward_model=reward_model, train_dataset=train_dataset,
                         value_model=value_model, peft_config=peft_config)
    rss_after_setup = current_rss_mb()
    policy_model = trainer.model.policy

    def generate(input_ids, attention_mask):
        return policy_model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
            temperature=settings.temperature, top_k=0, top_p=1.0,
            max_new_tokens=settings.response_length, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id)

    def ref_logprobs(sequences, attention_mask, context):
        if ref_model is not None:
            return causal_lm_logprobs(ref_model, sequences, attention_mask, context)
        with policy_model.disable_adapter():
            return causal_lm_logprobs(policy_model, sequences, attention_mask, context)

    def run_eval(update: int) -> dict[str, float]:
        was_training = policy_model.training
        policy_model.eval()
        result = evaluate(tokenizer, eval_prompts, settings, generate,
                          lambda s, a, c: causal_lm_logprobs(policy_model, s, a, c), ref_logprobs)
        policy_model.train(was_training)
        return {"update": update, **result}

    clock = UpdateClock()
    peak = TrainingPeak() if settings.device == "cuda" else None
    print("model built; evaluating the start", flush=True)
    evals = [run_eval(0)]
    train_logs: list[dict[str, float]] = []

    class TimingCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if settings.device == "cuda":
                torch.cuda.synchronize()
            clock.update_done()
            # progress in the side's log
            print(f"update {state.global_step}/{settings.updates} done", flush=True)
            if (state.global_step % settings.eval_every == 0
                or state.global_step == settings.updates):
                if peak:
                    peak.pause()
                evals.append(run_eval(state.global_step))
                if peak:
                    peak.resume()
            clock.resume()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "objective/kl" in logs:
                train_logs.append({k: float(v) for k, v in logs.items()
                                   if isinstance(v, (int, float, str))})

    trainer.add_callback(TimingCallback())
    if peak:
        peak.start()
    clock.resume()
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start
    timed = clock.seconds[settings.warmup_updates:]
    per_update = median(timed)
    result: dict[str, Any] = {
        "side": "trl",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                     "torch": torch.__version__},
        "settings": settings.__dict__,
        "context_length": context_length,
        "update_seconds": clock.seconds,
        "update_cpu_seconds": clock.cpu_seconds,
        "cpu_seconds_per_update": median(clock.cpu_seconds[settings.warmup_updates:]),
        "seconds_per_update": per_update,
        "train_seconds": train_seconds,
        "tokens_per_second": settings.batch_size * settings.response_length / per_update,
        "rss_after_imports_mb": rss_after_imports,
        "rss_after_setup_mb": rss_after_setup,
        "peak_rss_mb": peak_rss_mb(),
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters()
                                    if p.requires_grad),
        "evals": evals,
        "train_logs": [{"kl": r["objective/kl"], "score": r["objective/scores"],
                        "clipfrac": r.get("policy/clipfrac_avg"),
                        "approxkl": r.get("policy/approxkl_avg")}
                       for r in train_logs],
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
