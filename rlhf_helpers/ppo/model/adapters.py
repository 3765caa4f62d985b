"""The shared model's LoRA adapters: their config, the reward adapter from disk, parameters by name.

    config = lora_config(r=8, alpha=16, target_modules=["c_attn"], fan_in_fan_out=uses_conv1d(lm))
    score_head = load_reward_adapter(peft_model, "runs/reward-tiny", hidden_size, fan_in_fan_out)
    params = params_by_adapter(peft_model, ("policy", "value", "reward"))

A known peft pitfall: peft's `set_adapter` changes `requires_grad`, so parameters are chosen by
adapter name, never by whatever happens to be trainable; a plain score head needs its own save.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from peft import LoraConfig, set_peft_model_state_dict
from safetensors.torch import load_file
from torch import nn

from rlhf_helpers.ppo.model.value_head import ScalarHead

#: File names of the reward step's output that `load_reward_adapter` reads (stages/reward_training).
SCORE_HEAD_FILE = "score_head.safetensors"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
#: A PPO checkpoint's layout (ppo/checkpoints/save_load.py): a peft folder per adapter, both heads
#: in one file.
CHECKPOINT_ADAPTERS_DIR = "adapters"
CHECKPOINT_HEADS_FILE = "heads.safetensors"


def uses_conv1d(model: nn.Module) -> bool:
    """True for GPT-2-style models whose projections are transformers' Conv1D (in, out) weights)."""
    return any(type(module).__name__ == "Conv1D" for module in model.modules())


def lora_config(r: int, alpha: int, target_modules: tuple[str, ...] | list[str],
                fan_in_fan_out: bool = False, task_type: str = "CAUSAL_LM") -> Any:
    """A LoRA config with dropout 0 (PPO compares two forwards of the same input)."""
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(target_modules),
                      bias="none", task_type=task_type, fan_in_fan_out=fan_in_fan_out)


def refuse_checkpointing(model: nn.Module | Iterable[nn.Module]) -> None:
    """ValueError if a module of `model` (or of a list of modules) has gradient checkpointing on."""
    modules = model.modules() if isinstance(model, nn.Module) else model
    if any(getattr(module, "gradient_checkpointing", False) is True for module in modules):
        raise ValueError(
            "gradient checkpointing must be off: its re-run forward during backward may "
            "use another adapter than the forward did, giving silently wrong gradients")


def reward_files(directory: str | Path) -> tuple[Path, Path, Path, str]:
    """(adapter config, adapter weights, head file, the head's key prefix) of a reward source: the
    reward step's folder, or a PPO checkpoint (its adapters/reward/ and the score_head.* entries of
    its heads file, so a resumed run needs no reward folder)."""
    directory = Path(directory)
    in_checkpoint = directory / CHECKPOINT_ADAPTERS_DIR / "reward"
    if in_checkpoint.is_dir():
        return (in_checkpoint / ADAPTER_CONFIG_FILE, in_checkpoint / ADAPTER_WEIGHTS_FILE,
                directory / CHECKPOINT_HEADS_FILE, "score_head.")
    return (directory / ADAPTER_CONFIG_FILE, directory / ADAPTER_WEIGHTS_FILE,
            directory / SCORE_HEAD_FILE, "")


def load_reward_adapter(peft_model: Any, directory: str | Path, hidden_size: int,
                        fan_in_fan_out: bool) -> ScalarHead:
    """Add the frozen `reward` adapter from the reward step's folder (or a PPO checkpoint) to
    `peft_model`; return its score head."""
    directory = Path(directory)
    config_file, weights, head_file, head_prefix = reward_files(directory)
    for path in (weights, head_file, config_file):
        if not path.is_file():
            raise FileNotFoundError(f"reward_dir lacks {path.name}: {directory} must be written by "
                                    "rlhf_helpers.stages.reward_training.train_reward_model")
    saved = json.loads(config_file.read_text())
    peft_model.add_adapter("reward", lora_config(saved["r"], saved["lora_alpha"],
                                                  sorted(saved["target_modules"]), fan_in_fan_out))
    state = {k: v for k, v in load_file(str(weights)).items() if "lora_" in k}
    result = set_peft_model_state_dict(peft_model, state, adapter_name="reward")
    missing = [k for k in result.missing_keys if ".reward." in k and "lora_" in k]
    if missing or not state:
        raise ValueError(f"reward adapter in {directory} does not fit this base model "
                         f"(missing {missing[:3]}...)")
    head = {k[len(head_prefix):]: v
            for k, v in load_file(str(head_file)).items() if k.startswith(head_prefix)}
    if "weight" not in head or head["weight"].shape != (1, hidden_size):
        shape = tuple(head["weight"].shape) if "weight" in head else "none"
        raise ValueError(f"score head weight must have shape (1, {hidden_size}), got {shape}")
    score = ScalarHead(hidden_size, bias="bias" in head)
    score.linear.load_state_dict(head)
    return score


def params_by_adapter(peft_model: nn.Module, adapters: tuple[str, ...]) -> dict[str,
                                                                                list[nn.Parameter]]:
    """Each named adapter's LoRA matrices; ValueError for one with none (bad target_modules)."""
    found: dict[str, list[nn.Parameter]] = {name: [] for name in adapters}
    for name, param in peft_model.named_parameters():
        if "lora_" not in name:
            continue
        for adapter in adapters:
            if f".{adapter}." in name or name.endswith(f".{adapter}"):
                found[adapter].append(param)
    for adapter, params in found.items():
        if not params:
            raise ValueError(
                f"no LoRA parameters found for adapter {adapter!r}: check target_modules")
    return found
