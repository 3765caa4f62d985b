"""Loading the tokenizer and models of a profile with the ordinary `from_pretrained` calls.

    tokenizer = load_tokenizer(profile)
    policy = load_causal_lm(profile)                      # dropouts 0, eval mode, on profile.device
    reward = load_sequence_classifier(profile, num_labels=1)

All three read `profile.sft_model_path` unless `path` is given (the tiny profile ships it in
data/models/tiny-sft; the gpu profile's is written by `rlhf_helpers.stages.sft.ensure_sft_model`).
Dropout is set to 0 in the config before the weights load: PPO compares two forwards of the same
input, and dropout would make them differ.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from safetensors import safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)
from transformers.utils import logging as hf_logging

from rlhf_helpers.runtime.profiles import Profile, get_profile

#: Token added as pad when a tokenizer has none distinct from EOS.
FALLBACK_PAD_TOKEN = "<|pad|>"

# peft and TRL still read `model.is_gradient_checkpointing`, which transformers >= 5.23 deprecates
# with a FutureWarning at every adapter wrap: noise a learner can do nothing about (checkpointing
# is off here)
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                        category=FutureWarning)


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Hide transformers' per-load "Loading weights" progress bar (a tiny model loads in
    milliseconds)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _model_path(profile: Profile, path: str | Path | None) -> str:
    chosen = Path(path) if path is not None else Path(profile.sft_model_path)
    if not chosen.is_dir():
        if path is None and profile.is_tiny:
            hint = ("train it with `python -m rlhf_helpers.world.build --model-only --out "
                    f"{chosen.parent.parent}`, "
                    "which reads that folder's sft.jsonl and changes no data file")
        elif path is None:
            hint = ("call `rlhf_helpers.stages.sft.ensure_sft_model(profile)` first: it fine-tunes "
                    "the hub model once and caches it there")
        else:
            hint = "pass a directory written by save_pretrained"
        raise FileNotFoundError(f"model directory not found: {chosen} ({hint})")
    return str(chosen)


def dropout_overrides(config: Any) -> dict[str, float]:
    """Config keyword arguments that set every dropout probability of `config` to 0.

    Covers GPT-2 (`resid_pdrop`, `embd_pdrop`, `attn_pdrop`, `summary_first_dropout`) and Llama
    (`attention_dropout`, `mlp_dropout`...): any float field whose name contains "dropout" or
    "pdrop".
    """
    return {
        key: 0.0
        for key, value in config.to_dict().items()
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float)
    }


def ensure_distinct_pad(tokenizer: Any) -> bool:
    """Give `tokenizer` a pad token different from EOS; True if a new token had to be added.

    With pad == EOS, masks built from the pad id also hide the real EOS of each response, so
    the model never learns to stop and GAE loses the final reward position.
    """
    if tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        return False
    added = tokenizer.add_special_tokens({"pad_token": FALLBACK_PAD_TOKEN})
    return added > 0


def load_tokenizer(profile: Profile | None = None, path: str | Path | None = None) -> Any:
    """The profile's tokenizer: pad distinct from EOS, left padding (for batched generation)."""
    profile = profile or get_profile()
    tokenizer = AutoTokenizer.from_pretrained(_model_path(profile, path))
    ensure_distinct_pad(tokenizer)
    tokenizer.padding_side = "left"
    return tokenizer


def _load(auto_class: Any, profile: Profile, path: str | Path | None, **kwargs: Any) -> Any:
    directory = _model_path(profile, path)
    config = AutoConfig.from_pretrained(directory)
    config = AutoConfig.from_pretrained(directory, **dropout_overrides(config), **kwargs)
    with quiet_loading():
        model = auto_class.from_pretrained(directory, config=config, dtype=profile.torch_dtype)
    tokenizer = load_tokenizer(profile, path)
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))  # a pad token was added
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(profile.device).eval()


def load_causal_lm(profile: Profile | None = None, path: str | Path | None = None) -> Any:
    """The profile's SFT model as an `AutoModelForCausalLM`, dropouts 0, in eval mode."""
    return _load(AutoModelForCausalLM, profile or get_profile(), path)


def load_sequence_classifier(
    profile: Profile | None = None, num_labels: int = 1, path: str | Path | None = None
) -> Any:
    """The SFT model with a fresh linear score head (`AutoModelForSequenceClassification`).

    `num_labels=1` gives the scalar head of a reward model or critic. The head reads the last
    non-pad token (`config.pad_token_id` is set), so padding on either side works.
    """
    if num_labels < 1:
        raise ValueError(f"num_labels must be >= 1, got {num_labels}")
    # the score head is new by design: hide the load report that lists it as "MISSING"
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return _load(AutoModelForSequenceClassification, profile or get_profile(), path,
                     num_labels=num_labels)
    finally:
        hf_logging.set_verbosity(verbosity)


def unknown_tokens(tokenizer: Any, texts: list[str]) -> tuple[float, int]:
    """(the share of the texts' tokens that are the tokenizer's unknown token, how many texts are
    nothing else).

    A word-level tokenizer (the tiny profile's) maps emoji, other scripts and unseen words to one
    unknown token: such a prompt reaches the policy as the same "<unk> <unk> ..." whatever it said.
    (0.0, 0) for a tokenizer without an unknown token (byte-level BPE: every text has a
    spelling)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not texts:
        return 0.0, 0
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    total = sum(len(row) for row in ids)
    unknown = sum(token == unk for row in ids for token in row)
    only = sum(1 for row in ids if row and all(token == unk for token in row))
    return unknown / max(total, 1), only


def model_folder_problem(profile: Profile) -> str | None:
    """What keeps the profile's SFT model folder from loading, in one line, or None: checked before
    a run trains anything (tiny profile: the shipped model, or $RLHF_DATA_DIR's). A folder not there
    (a gpu-profile SFT model not fine-tuned yet) is no problem here when the profile fine-tunes it;
    the tiny profile's must be there."""
    folder = Path(profile.sft_model_path)
    if not folder.is_dir():
        if not profile.is_tiny:
            return None
        try:
            _model_path(profile, None)
        except FileNotFoundError as error:
            return str(error)
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as error:
        return f"{folder / 'config.json'} does not load ({str(error).splitlines()[0]})"
    weights = folder / "model.safetensors"
    if weights.is_file():
        try:
            with safe_open(str(weights), framework="pt") as handle:
                handle.keys()
        except Exception as error:  # safetensors raises its own SafetensorError
            return f"{weights} is damaged ({type(error).__name__}: truncated or overwritten)"
    elif not any((folder / name).is_file()
                 for name in ("pytorch_model.bin", "model.safetensors.index.json",
                                                          "pytorch_model.bin.index.json")):
        return f"{folder} holds no weights (model.safetensors or pytorch_model.bin)"
    if not any((folder / name).is_file()
               for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return (f"its tokenizer does not load: {folder} holds no tokenizer.json, "
                "tokenizer_config.json or vocab.json")
    try:
        with quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as error:  # OSError, ValueError or transformers' own errors
        return (f"its tokenizer does not load ({type(error).__name__}: "
                f"{str(error).splitlines()[0][:120]})")
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    # ids past the embedding: an index error mid-run
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        return (f"its tokenizer has {len(tokenizer)} tokens, the model's config.json {vocab}: not "
                "one model's files")
    return None
