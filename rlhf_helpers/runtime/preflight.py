"""Do a run's settings fit its machine and its model? Asked before any model is built, answered in
one line.

    path = profile.sft_model_path
    device_problem("cuda")                  # "... torch sees no CUDA GPU ..." on a CPU machine
    base_problem(profile)                   # the above, or its GGUF weights file missing or cut
    model_limits_problem(path, 64, lora)    # a LoRA rank above the hidden size, a typo'd target
    model_limits_problem(path, 64, lora, prompt_tokens=24, new_tokens=16)  # PPO: the lengths too
    batch_memory_problem(path, rows=10**9, new_tokens=8, device="cpu")  # logits beyond the memory

Each returns None when all is well. The reward and PPO commands turn a problem into exit 2, so a
setting the model cannot use costs a second instead of a reward-model training and a traceback from
deep inside torch or peft.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from rlhf_helpers.runtime.weights import require_weights

#: LoRA target names each model family has (transformers' module names), for a typo found before any
#: model is built
KNOWN_TARGETS = {"gpt2": {"c_attn", "c_proj", "c_fc", "lm_head", "attn.c_attn", "attn.c_proj",
                          "mlp.c_fc", "mlp.c_proj"},
                 "llama": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj", "lm_head"}}
#: Bytes of one logit in the narrowest dtype a profile computes in (bfloat16, float16): a bound that
#: holds in any.
LOGIT_BYTES = 2


def _model_config(model_dir: str | Path) -> dict[str, Any] | None:
    """The model's config.json as a dict, or None where it cannot be read (the caller then checks
    nothing: a gpu-profile SFT model is not fine-tuned yet, and `models.model_folder_problem` names
    a damaged one)."""
    try:
        model = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return model if isinstance(model, dict) else None


def device_problem(device: str) -> str | None:
    """Why torch cannot run on `device` here ("cuda" with no CUDA GPU visible, an index past the
    last GPU, "mps" off a Mac), or None. A run silently moved to the CPU would take hours instead of
    minutes."""
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return (f"device {device!r}: torch sees no CUDA GPU on this machine "
                    "(torch.cuda.is_available() is "
                    "False); set \"device\": \"cpu\" in $RLHF_PROFILE_OVERRIDES to run on the CPU")
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            return (f"device {device!r}: this machine has {count} CUDA GPU(s), numbered 0 to "
                    f"{count - 1}")
    if device == "mps" and not torch.backends.mps.is_available():
        return "device 'mps': torch sees no Apple GPU on this machine; use 'cpu'"
    return None


def base_problem(profile: Any) -> str | None:
    """Why `profile`'s base model cannot be built on this machine, naming the profile: a device
    torch cannot use (`device_problem`), or its GGUF weights file missing or cut short (how to get
    it); None when it can. The SFT, reward and PPO commands all ask it first."""
    problem = device_problem(profile.device)
    if problem is not None:
        return f"the {profile.name} profile's {problem}"
    try:
        require_weights(profile.weights)
    except FileNotFoundError as error:
        return f"the {profile.name} profile's weights: {error}"
    return None


def model_limits_problem(model_dir: str | Path, max_length: int, lora: Any,
                         prompt_tokens: int | None = None, new_tokens: int | None = None,
                         flags: dict[str, str] | None = None) -> str | None:
    """What in these settings the model in `model_dir` cannot take (read from its config.json), or
    None: `max_length` (or prompt + new tokens) beyond its positions, a LoRA rank above its hidden
    size, a LoRA target it has no module of. A folder without a readable config.json (a gpu-profile
    SFT model not fine-tuned yet) is not checked here. Settings are named by field ("lora.r"),
    followed by the caller's flag for it when `flags` has one ("lora.r (--lora-r)")."""
    def name(field: str) -> str:
        return f"{field} ({flags[field]})" if flags and field in flags else field

    config_file = Path(model_dir) / "config.json"
    model = _model_config(model_dir)
    if model is None:
        return None
    positions = model.get("n_positions") or model.get("max_position_embeddings")
    if isinstance(positions, int):
        if (prompt_tokens is not None and new_tokens is not None
                and prompt_tokens + new_tokens > positions):
            return (f"{name('max_prompt_length')} {prompt_tokens} + {name('max_new_tokens')} "
                    f"{new_tokens} = {prompt_tokens + new_tokens} tokens exceed the model's "
                    f"{positions} positions ({config_file})")
        if max_length > positions:
            return (f"{name('max_length')} {max_length} exceeds the model's {positions} positions "
                    f"({config_file})")
    hidden = model.get("n_embd") or model.get("hidden_size")
    if isinstance(hidden, int) and lora.r > hidden:
        return (f"{name('lora.r')} {lora.r} exceeds the model's hidden size {hidden}: a rank above "
                f"it adds nothing a full update would not ({config_file})")
    known = KNOWN_TARGETS.get(model.get("model_type"))
    unknown = sorted(set(lora.target_modules) - known) if known else []
    if unknown:
        return (f"{name('lora.target_modules')}: {', '.join(unknown)} is not a module of this "
                f"{model.get('model_type')} model; its names: {', '.join(sorted(known))}")
    return None


def machine_memory_bytes(device: str) -> int:
    """Total memory of the device a run computes on: the GPU's for "cuda[:N]", the machine's RAM
    otherwise."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(int(device.partition(":")[2] or 0)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def batch_memory_problem(model_dir: str | Path, rows: int, new_tokens: int,
                         device: str) -> str | None:
    """None unless the logits of `rows` sequences of `new_tokens` tokens cannot fit the device's
    whole memory.

    A lower bound, not an estimate: the reference pass scores the whole rollout batch in one
    forward, which holds its (rows, new_tokens, vocabulary) logits at once (at least 2 bytes each),
    so a batch whose logits alone exceed the memory fails (MemoryError, or an allocator traceback
    deep in torch) whatever else the run holds. The vocabulary size is read from config.json."""
    model = _model_config(model_dir)
    vocab = model.get("vocab_size") if model is not None else None
    if not isinstance(vocab, int):
        return None
    needed = rows * new_tokens * vocab * LOGIT_BYTES
    available = machine_memory_bytes(device)
    if needed <= available:
        return None
    return (f"a batch of {rows} prompts x {new_tokens} new tokens x {vocab} vocabulary entries "
            f"needs at least {needed / 2**30:.3g} GiB for its logits alone, more than the "
            f"{available / 2**30:.3g} GiB "
            f"of {device}: lower rollout_batch_size, eval_batch_size or max_new_tokens")
