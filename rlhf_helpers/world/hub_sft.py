"""Supervised fine-tuning of the gpu profile's hub model on the SFT corpus with TRL's SFTTrainer.

    python -m rlhf_helpers.world.hub_sft          # on a GPU machine with hub access (Colab)

loads `profile.base_model` (HuggingFaceTB/SmolLM2-135M) with `from_pretrained`, trains it on
data/sft.jsonl (prompt-completion format, loss on the completion only, EOS appended by TRL),
and saves model + tokenizer to `profile.sft_model_path`, where `models.load_causal_lm` finds it.
Tests exercise the same code on a randomly initialised model of the same architecture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf_helpers.profiles import Profile, get_profile


def sft_config(
    profile: Profile, output_dir: str | Path, max_steps: int = -1, logging_steps: int = 10
) -> Any:
    """TRL `SFTConfig` for the profile: completion-only loss, no gradient checkpointing.

    bf16 only when the profile asks for it on CUDA; on a CPU `use_cpu=True` (TRL's defaults,
    bf16 and gradient checkpointing on, are wrong there).
    """
    from trl import SFTConfig

    from rlhf_helpers._compat import checkpointing_off

    on_cpu = profile.device == "cpu"
    return SFTConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=profile.sft_batch_size,
        learning_rate=profile.sft_lr,
        num_train_epochs=profile.sft_epochs,
        max_steps=max_steps,
        max_length=profile.max_length,
        completion_only_loss=True,
        bf16=profile.dtype == "bfloat16" and not on_cpu,
        use_cpu=on_cpu,
        **checkpointing_off(SFTConfig),  # TRL defaults it on; it breaks adapter switching later
        lr_scheduler_type="cosine",
        warmup_steps=10 if max_steps <= 0 else max(1, max_steps // 10),
        logging_steps=logging_steps,
        save_strategy="no",
        report_to="none",
        seed=profile.seed,
        dataloader_num_workers=0,
    )


def sft_with_trl(
    model: Any,
    tokenizer: Any,
    records: list[dict],
    profile: Profile,
    output_dir: str | Path,
    max_steps: int = -1,
    logging_steps: int = 10,
) -> list[dict]:
    """Fine-tune `model` on prompt-completion `records` and save it to `output_dir`.

    Returns TRL's log history (a list of dicts with "loss" among others).
    """
    from datasets import Dataset
    from trl import SFTTrainer

    from rlhf_helpers.models import ensure_distinct_pad

    if ensure_distinct_pad(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"  # training pads on the right; generation switches to left
    trainer = SFTTrainer(
        model=model,
        args=sft_config(profile, output_dir, max_steps, logging_steps),
        train_dataset=Dataset.from_list(records),
        processing_class=tokenizer,
    )
    trainer.train()
    tokenizer.padding_side = "left"
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))
    return trainer.state.log_history


def prepare_sft_model(profile: Profile | None = None, force: bool = False) -> Path:
    """Make sure `profile.sft_model_path` holds the fine-tuned hub model; returns the path.

    Downloads `profile.base_model` from the hub (the only code path that does), so it is meant
    for Colab or a GPU machine, never for tests.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_helpers.data import load_sft_corpus

    profile = profile or get_profile("gpu")
    output = Path(profile.sft_model_path)
    if (output / "config.json").is_file() and not force:
        return output
    tokenizer = AutoTokenizer.from_pretrained(profile.base_model)
    model = AutoModelForCausalLM.from_pretrained(profile.base_model, dtype=profile.torch_dtype)
    sft_with_trl(model.to(profile.device), tokenizer, load_sft_corpus(), profile, output)
    return output


if __name__ == "__main__":
    print(prepare_sft_model(force=True))
