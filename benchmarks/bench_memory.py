"""Memory of one shared base with LoRA roles against four separate models, in one PPO step.

    python -m benchmarks memory          # tiny and GPT-2-small sizes on the CPU (~3-5 min)
    python -m benchmarks memory --fast   # tiny, and SmolLM2 shrunk to 2 layers (~45 s)
    python -m benchmarks.bench_memory --sizes smollm2 --batch 4 --new-tokens 8  # gpu arch., CPU
    python -m benchmarks.bench_memory --device cuda   # gpu profile's architecture and sizes, bf16

Sides (each measured in its own subprocess, one after the other):
- `shared`: our design, `SharedLoRAModel`: one base model + `policy`, `value` and `reward` LoRA
  adapters + value and score heads; the reference is the base with every adapter disabled.
- `four`: four separate full models of the same base: a policy (trained by full fine-tuning), a
  frozen reference copy, a value model (a copy of the transformer + value head, trained by full
  fine-tuning) and a frozen reward model (a copy of the transformer + score head). This is the
  classic PPO layout (InstructGPT, DeepSpeed-Chat, OpenRLHF, TRL's PPOTrainer without a peft
  config), and what "four models" costs in practice: two full optimiser states on top of four weight
  copies.
- `four_lora` (also run): the same four separate copies, but policy and value trained through LoRA
  adapters (the reward stays a separate frozen copy). It separates the two savings: `four_lora` /
  `four` is what LoRA saves on optimiser state and gradients, `shared` / `four_lora` what sharing
  one base saves on weights.

The work, identical on every side: `PPOTrainer.step()` of the engine (the four-model side plugs
`FourModels`, which has the shared model's interface, into the same trainer) with rollout batch =
minibatch = B and one PPO epoch: sample B responses, the policy / reference / value / reward passes,
shaped rewards and GAE, then exactly one minibatch update of the policy (clip loss, Adam step) and
of the critic (value loss, Adam step). All sides start from the same base weights and the same
seed, so (LoRA's B matrices start at 0) they sample the same responses.

Measured per side: peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`) minus the peak RSS after
every import (the baseline; tracemalloc does not see torch's allocations), and on CUDA
`torch.cuda.max_memory_allocated()`. Parameter bytes count each role's unique parameters
(numel * element_size). Goal: shared peak <= 0.4 x four-model peak.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as `python benchmarks/bench_memory.py`
    sys.path.insert(0, str(REPO_ROOT))

from rlhf_helpers.core.tokens import last_token_index, position_ids_from_mask  # noqa: E402
from rlhf_helpers.ppo.model.adapters import lora_config, uses_conv1d  # noqa: E402
from rlhf_helpers.ppo.model.fused_lora import fuse_tanh_gelu  # noqa: E402
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel  # noqa: E402
from rlhf_helpers.ppo.model.value_head import ScalarHead  # noqa: E402
from rlhf_helpers.runtime.lora import LoRASpec  # noqa: E402

SIDES = ("shared", "four", "four_lora")
#: Goal: the shared design's peak memory at most this fraction of four models'.
GOAL_RATIO = 0.4
TINY_MODEL_DIR = REPO_ROOT / "data" / "models" / "tiny-sft"
#: GPT-2 small (124M parameters with GPT-2's vocabulary), randomly initialised.
GPT2_SMALL_CONFIG: dict[str, Any] = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
                                     "n_embd": 768, "n_layer": 12, "n_head": 12}
#: transformer layers of the random-init sizes in a fast (smoke) run
FAST_LAYERS = 2


def architecture(size: str, layers: int | None = None) -> dict[str, Any]:
    """The config fields of a random-init size ("gpt2", "smollm2"), with `layers` transformer layers
    if given."""
    from rlhf_helpers.runtime.architectures import SMOLLM2_135M_CONFIG

    spec = dict(GPT2_SMALL_CONFIG if size == "gpt2" else SMOLLM2_135M_CONFIG)
    if layers is not None:
        spec["n_layer" if size == "gpt2" else "num_hidden_layers"] = layers
    return spec


@dataclass
class SizeSpec:
    """One model size of the benchmark and the PPO step it runs."""

    name: str  #: "tiny", "gpt2" or "smollm2"
    batch: int  #: prompts per rollout = the one minibatch of the update
    new_tokens: int  #: max new tokens per response
    prompt_tokens: int  #: prompts longer than this are cut from the left
    lora_r: int  #: LoRA rank of every adapter
    lora_alpha: int  #: LoRA alpha
    lora_targets: tuple[str, ...]  #: module names LoRA wraps
    #: transformer layers of a random-init size (gpt2, smollm2); None: the architecture's own. The
    #: default fast run on the CPU keeps 2 for smollm2: the same code path (architecture,
    #: vocabulary, LoRA targets, dtype) in a stack a CPU runs in seconds
    layers: int | None = None


def size_spec(name: str, fast: bool = False, layers: int | None = None) -> SizeSpec:
    """The default step of each size: tiny and gpt2 use the tiny profile's PPO settings (gpt2 with a
    smaller batch, to stay near a minute per side on one CPU thread); smollm2 the gpu profile's."""
    from rlhf_helpers.runtime.profiles import get_profile

    # the tiny model is shipped: its layers are its own
    layers = layers if name in ("gpt2", "smollm2") else None
    if name in ("tiny", "gpt2"):
        # $RLHF_PROFILE_OVERRIDES may name gpu weights
        profile = get_profile("tiny", weights="shipped")
        batch = profile.ppo.mini_batch_size if name == "tiny" else 8
        new_tokens = profile.ppo.max_new_tokens if name == "tiny" else 24
        if fast:
            batch, new_tokens = min(batch, 8), min(new_tokens, 16)
    elif name == "smollm2":
        profile = get_profile("gpu")
        batch, new_tokens = (4, 8) if fast else (profile.ppo.mini_batch_size,
                                                 profile.ppo.max_new_tokens)
    else:
        raise ValueError(f"size must be 'tiny', 'gpt2' or 'smollm2', got {name!r}")
    return SizeSpec(name=name, batch=batch, new_tokens=new_tokens,
                    prompt_tokens=profile.ppo.max_prompt_length,
                    lora_r=profile.lora.r, lora_alpha=profile.lora.alpha,
                    lora_targets=tuple(profile.lora.target_modules), layers=layers)


# ----------------------------------------------------------------------------- models
def load_tokenizer() -> Any:
    """The shipped word-level tokenizer (also for random-init sizes: only memory matters there;
    sampled ids beyond its vocabulary decode to nothing)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))
    tokenizer.padding_side = "left"
    return tokenizer


def load_base(size: str, tokenizer: Any, dtype: torch.dtype, device: str, seed: int = 0,
              layers: int | None = None) -> nn.Module:
    """The base causal LM of a size (dropout 0, eval mode): the shipped tiny model, or a randomly
    initialised GPT-2 small / SmolLM2-135M (the gpu profile's architecture; no hub here), with
    `layers` transformer layers when given."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlhf_helpers.runtime.models import dropout_overrides

    if size == "tiny":
        config = AutoConfig.from_pretrained(str(TINY_MODEL_DIR))
    else:
        spec = architecture(size, layers)
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    for key, value in dropout_overrides(config).items():
        setattr(config, key, value)
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config.bos_token_id = tokenizer.eos_token_id
    torch.manual_seed(seed)
    if size == "tiny":
        model = AutoModelForCausalLM.from_pretrained(str(TINY_MODEL_DIR),
                                                     config=config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device).eval()


def backbone_of(lm: nn.Module) -> nn.Module:
    """The transformer without its LM head (GPT-2: `.transformer`, Llama: `.model`)."""
    return getattr(lm, lm.base_model_prefix)


class FourModels(SharedLoRAModel):
    """Policy, reference, value model and reward model as four separate copies of one base.

    A `SharedLoRAModel` whose four roles live in separate models: it keeps the shared model's
    interface (what `PPOTrainer` and `collect_experience` call) and inherits its sampling loop and
    policy forward unchanged (run on the policy copy, `lm`), so both sides do exactly the same work.
    `lora=False`: policy and value model are trained by full fine-tuning; `lora=True`: each gets a
    LoRA adapter (`r`, `alpha`, `targets`) and only that trains. Reference and reward are frozen.
    """

    def __init__(self, base: nn.Module, pad_token_id: int, eos_token_id: int, lora: bool = False,
                 r: int = 8, lora_alpha: int = 16,
                 targets: tuple[str, ...] = ("c_attn", "c_proj", "c_fc"), seed: int = 0) -> None:
        nn.Module.__init__(self)  # not SharedLoRAModel's: no adapters on a shared base here
        from peft import get_peft_model

        self.pad_token_id, self.eos_token_id = int(pad_token_id), int(eos_token_id)
        hidden_size = base.config.get_text_config().hidden_size
        # the shared model's default activation kernel, for the same activations
        fuse_tanh_gelu(base)
        torch.manual_seed(seed)
        policy = copy.deepcopy(base)
        value_backbone = copy.deepcopy(backbone_of(base))
        if lora:
            fan_in_fan_out = uses_conv1d(base)
            # peft reads transformers' deprecated checkpointing flag
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                policy = get_peft_model(
                    policy, lora_config(r, lora_alpha, targets, fan_in_fan_out)).base_model.model
                value_backbone = get_peft_model(value_backbone, lora_config(
                    r, lora_alpha, targets, fan_in_fan_out,
                    task_type="FEATURE_EXTRACTION")).base_model.model
        self.policy = policy  #: the trained policy LM
        self.reference_model = copy.deepcopy(base).requires_grad_(False)  #: frozen copy of the base
        self.value_model = value_backbone  #: transformer of the critic
        #: V(s_t) from its states
        self.value_head = ScalarHead(hidden_size, bias=True, init_std=1e-2)
        #: frozen transformer
        self.reward_model = copy.deepcopy(backbone_of(base)).requires_grad_(False)
        self.score_head = ScalarHead(hidden_size, bias=False, init_std=1.0 / hidden_size**0.5)
        self.score_head.requires_grad_(False)
        device = next(base.parameters()).device
        self.value_head.to(device=device, dtype=torch.float32)
        self.score_head.to(device=device, dtype=torch.float32)
        #: the plain sampling loop on every device (SharedLoRAModel's fast CUDA sampler folds a
        #: shared base's adapters; these copies have none to fold)
        self.fast_sampling = False
        self.fast_decoder = None
        #: transformers' own forwards and sampling loop (no packed GPT-2 path here)
        self.packed = False
        nn.Module.train(self, False)  # dropout off, as in the shared model

    # ------------------------------------------------------------------ what SharedLoRAModel reads
    @property
    def lm(self) -> nn.Module:
        """The policy LM: the inherited sampling loop and policy forward run on it."""
        return self.policy

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def use(self, adapter: str) -> None:
        """Nothing to switch: every role has its own model (only the policy samples here)."""
        if adapter != "policy":
            raise ValueError(f"adapter must be 'policy' for FourModels, got {adapter!r}")

    def policy_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def value_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.value_model.parameters()
                if p.requires_grad] + list(self.value_head.parameters())

    def role_modules(self) -> dict[str, list[nn.Module]]:
        """The modules holding each role's parameters."""
        return {"policy": [self.policy], "reference": [self.reference_model],
                "value": [self.value_model, self.value_head],
                "reward": [self.reward_model, self.score_head]}

    def parameter_bytes(self) -> dict[str, int]:
        """Bytes of each role's distinct parameters, and of all four models together."""
        out = {role: unique_bytes(modules) for role, modules in self.role_modules().items()}
        out["total"] = unique_bytes([self])
        return out

    # ------------------------------------------------------------------ the other roles' forwards
    def _states(self, model: nn.Module, input_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids_from_mask(attention_mask), use_cache=False)
        return out.last_hidden_state  # (B, L, H)

    def ref_logprobs(self, input_ids, attention_mask, context_length, temperature: float = 1.0):
        """log ref(y_t) from the frozen reference copy, at the policy's temperature: (B, L) -> (B,
        R)."""
        with torch.no_grad():
            logits = self.reference_model(input_ids=input_ids, attention_mask=attention_mask,
                                          position_ids=position_ids_from_mask(attention_mask),
                                          use_cache=False).logits  # (B, L, V)
        response_logits = logits[:, context_length - 1 : -1]  # (B, R, V): position s predicts s + 1
        return self._logprobs_of(response_logits, input_ids[:, context_length:], False,
                                 temperature=temperature)  # (B, R)

    def values(self, input_ids, attention_mask, context_length):
        """V(s_t) from the value model's transformer and head: (B, L) -> (B, R)."""
        hidden = self._states(self.value_model, input_ids, attention_mask)  # (B, L, H)
        return self.value_head(hidden[:, context_length - 1 : -1])  # (B, R)

    def reward_scores(self, input_ids, attention_mask):
        """Score head on the reward model's state at each row's last real token: (B, L) -> (B,)."""
        with torch.no_grad():
            hidden = self._states(self.reward_model, input_ids, attention_mask)  # (B, L, H)
            last = last_token_index(attention_mask)  # (B,)
            picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, H)
            return self.score_head(picked[:, None, :])[:, 0]  # (B,)


def unique_bytes(modules: list[nn.Module]) -> int:
    """Bytes of the distinct parameters of some modules (tied weights counted once)."""
    seen: dict[int, nn.Parameter] = {}
    for module in modules:
        for param in module.parameters():
            seen[id(param)] = param
    return sum(p.numel() * p.element_size() for p in seen.values())


def parameter_bytes(model: SharedLoRAModel) -> dict[str, int]:
    """Bytes of each role's parameters and their total, for either side.

    shared: base, policy / value / reward adapters, heads (`SharedLoRAModel.parameter_bytes`);
    four models: policy, reference, value (transformer + head), reward (transformer + head).
    """
    if not isinstance(model, SharedLoRAModel):
        raise ValueError(
            f"model must be a SharedLoRAModel or FourModels, got {type(model).__name__}")
    return model.parameter_bytes()


def build_side(side: str, base: nn.Module, tokenizer: Any, spec: SizeSpec,
               seed: int = 0) -> nn.Module:
    """The model of one side on `base` (which the side then owns)."""
    if side == "shared":
        return SharedLoRAModel(
            base,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            seed=seed,
            lora=LoRASpec(r=spec.lora_r, alpha=spec.lora_alpha, target_modules=spec.lora_targets),
        )
    if side in ("four", "four_lora"):
        return FourModels(base, tokenizer.pad_token_id, tokenizer.eos_token_id,
                          lora=side == "four_lora", r=spec.lora_r, lora_alpha=spec.lora_alpha,
                          targets=spec.lora_targets, seed=seed)
    raise ValueError(f"side must be one of {SIDES}, got {side!r}")


def optimizer_state_bytes(*optimizers: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in the optimisers' state (Adam: two moments per trained parameter)."""
    return sum(v.numel() * v.element_size() for opt in optimizers for state in opt.state.values()
               for v in state.values() if torch.is_tensor(v) and v.ndim > 0)


# ----------------------------------------------------------------------------- one side, in its own
# process
def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MB (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def warm_up(side: str, device: str, dtype: torch.dtype, spec: SizeSpec) -> None:
    """One PPO step of the same side on the 2-layer toy model, then freed: the lazy imports,
    kernels' first-call set-up and (on CUDA) the context that any first step pays are outside the
    baseline."""
    import gc

    # the tests' toy world, not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from toy_world import toy_causal_lm, toy_tokenizer

    from rlhf_helpers.ppo.trainer import PPOTrainer
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    tokenizer = toy_tokenizer()
    base = toy_causal_lm(tokenizer).to(device=device, dtype=dtype)
    targets = tuple(t for t in spec.lora_targets
                    if t in {"c_attn", "c_proj", "c_fc"}) or ("c_attn",)
    toy_spec = SizeSpec("toy", 2, 2, 4, 2, 4, targets)
    model = build_side(side, base, tokenizer, toy_spec)
    # the config's LoRA spec is the model's (the trainer refuses two specs): r 2 on the toy's own
    # targets
    config = PPOConfig(rollout_batch_size=2, mini_batch_size=2, ppo_epochs=1, max_prompt_length=4,
                       max_new_tokens=2, lora=LoRASpec(r=toy_spec.lora_r, alpha=toy_spec.lora_alpha,
                                                       target_modules=toy_spec.lora_targets),
                       progress_bar=False)
    PPOTrainer(config, model, tokenizer, ["the movie was"], hidden_score_fn=None).step()
    del model, base
    gc.collect()


def measure_side(side: str, size: str, device: str = "cpu", dtype: str = "float32",
                 batch: int | None = None, new_tokens: int | None = None, fast: bool = False,
                 seed: int = 0, layers: int | None = None) -> dict[str, Any]:
    """Build one side and run one PPO step in this process; return its memory figures.

    Call in a fresh process (see `run_side`): the peak RSS of a process never goes down.
    """
    import peft  # noqa: F401  (imported before the baseline, with everything the step uses)
    import transformers  # noqa: F401

    from rlhf_helpers.ppo.trainer import PPOTrainer
    from rlhf_helpers.runtime.data import load_prompts
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    torch.set_num_threads(1)
    spec = size_spec(size, fast, layers)
    if batch is not None:
        spec.batch = batch
    if new_tokens is not None:
        spec.new_tokens = new_tokens
    torch_dtype = getattr(torch, dtype)
    tokenizer = load_tokenizer()
    prompts = load_prompts("train")
    on_cuda = device.startswith("cuda")
    warm_up(side, device, torch_dtype, spec)
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    baseline_mb = peak_rss_mb()  # after every import and the warm-up, before any model exists
    cuda_baseline = torch.cuda.memory_allocated() if on_cuda else 0

    wall, cpu = time.perf_counter(), time.process_time()
    model = build_side(side, load_base(size, tokenizer, torch_dtype, device, seed, spec.layers),
                       tokenizer, spec, seed)
    built_mb = peak_rss_mb()
    config = PPOConfig(rollout_batch_size=spec.batch, mini_batch_size=spec.batch, ppo_epochs=1,
                       max_prompt_length=spec.prompt_tokens, max_new_tokens=spec.new_tokens,
                       lora=LoRASpec(r=spec.lora_r, alpha=spec.lora_alpha,
                                     target_modules=spec.lora_targets),
                       seed=seed, progress_bar=False)
    trainer = PPOTrainer(config, model, tokenizer, prompts, hidden_score_fn=None)
    metrics = trainer.step()  # rollouts + one minibatch update of policy and critic
    if on_cuda:
        torch.cuda.synchronize()
    params = parameter_bytes(model)
    trainable = (sum(p.numel() for p in model.policy_parameters())
                 + sum(p.numel() for p in model.value_parameters()))
    out = {
        "side": side, "size": size, "device": device, "dtype": dtype, "spec": asdict(spec),
        "baseline_rss_mb": baseline_mb, "peak_rss_mb": peak_rss_mb(),
        "peak_above_baseline_mb": peak_rss_mb() - baseline_mb,
        "after_build_above_baseline_mb": built_mb - baseline_mb, "param_bytes": params,
        "trainable_params": trainable, "optimizer_state_bytes": optimizer_state_bytes(
            trainer.policy_opt.optimizer, trainer.value_opt.optimizer),
        "response_length": metrics["response_length"], "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu, "torch": torch.__version__,
    }
    if on_cuda:
        out["cuda_peak_mb"] = (torch.cuda.max_memory_allocated() - cuda_baseline) / 2**20
        out["cuda_device"] = torch.cuda.get_device_name()
    return out


def run_side(side: str, size: str, device: str, dtype: str, batch: int | None,
             new_tokens: int | None,
             fast: bool, timeout: float = 1800.0, layers: int | None = None) -> dict[str, Any]:
    """`measure_side` in a fresh subprocess (one thread); its figures."""
    command = [sys.executable, "-m", "benchmarks.bench_memory", "--worker", side, "--sizes", size,
               "--device", device, "--dtype", dtype]
    if batch is not None:
        command += ["--batch", str(batch)]
    if new_tokens is not None:
        command += ["--new-tokens", str(new_tokens)]
    if fast:
        command.append("--fast")
    if layers is not None:
        command += ["--layers", str(layers)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"bench_memory worker {side}/{size} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- the comparison
def compare(results: dict[str, dict[str, Any]], size: str) -> dict[str, Any]:
    """Flat figures of one size: MB per side, shared/four ratios, goal check."""
    mb = 2**20
    figures: dict[str, Any] = {}
    peak_key = "cuda_peak_mb" if "cuda_peak_mb" in results["shared"] else "peak_above_baseline_mb"
    for side, r in results.items():
        figures[f"{size}_{side}_param_mb"] = r["param_bytes"]["total"] / mb
        figures[f"{size}_{side}_peak_mb"] = r[peak_key]
        figures[f"{size}_{side}_optimizer_state_mb"] = r["optimizer_state_bytes"] / mb
        figures[f"{size}_{side}_trainable_params"] = r["trainable_params"]
        figures[f"{size}_{side}_cpu_s"] = r["cpu_s"]
    for other in ("four", "four_lora"):
        if other in results:
            figures[f"{size}_param_ratio_shared_over_{other}"] = (
                results["shared"]["param_bytes"]["total"] / results[other]["param_bytes"]["total"])
            figures[f"{size}_peak_ratio_shared_over_{other}"] = (
                results["shared"][peak_key] / results[other][peak_key])
    if "four" in results:
        figures[f"{size}_goal_met"] = figures[f"{size}_peak_ratio_shared_over_four"] <= GOAL_RATIO
    figures[f"{size}_peak_measure"] = ("torch.cuda.max_memory_allocated"
                                       if peak_key == "cuda_peak_mb" else \
        "ru_maxrss above post-import baseline")
    return figures


def ppo_estimate(spec: dict[str, Any], dtype: str, device: str) -> Any:
    """`rlhf_helpers.ppo.model.memory_estimate.estimate_ppo_memory` of the step a side ran
    (`asdict(SizeSpec)`) on `device`: rollout batch = minibatch = spec["batch"], the fast sampler on
    CUDA; None for sizes that are not the gpu profile's Llama."""
    from rlhf_helpers.ppo.model.memory_estimate import ModelShape, estimate_ppo_memory
    from rlhf_helpers.runtime.profiles import get_profile

    if spec["name"] != "smollm2":
        return None
    profile = get_profile(
        "gpu", dtype=dtype, rollout_batch_size=spec["batch"], mini_batch_size=spec["batch"],
        max_new_tokens=spec["new_tokens"], max_prompt_length=spec["prompt_tokens"],
        lora=LoRASpec(r=spec["lora_r"], alpha=spec["lora_alpha"],
                      target_modules=tuple(spec["lora_targets"])),
        eval_batch_size=spec["batch"])
    shape = ModelShape.from_config(architecture("smollm2", spec.get("layers")))
    return estimate_ppo_memory(profile, shape, fast_sampling=device == "cuda")


def measure_all(fast: bool = False, device: str = "cpu", sizes: tuple[str, ...] | None = None,
                sides: tuple[str, ...] = SIDES, dtype: str | None = None, batch: int | None = None,
                new_tokens: int | None = None, verbose: bool = True,
                layers: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run every (size, side) in its own subprocess: (flat figures, every side's own figures by
    size)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if "shared" not in sides:
        raise ValueError(
            f"sides must include 'shared' (the ratios are shared / other), got {sides}")
    if sizes is None:
        sizes = ("smollm2",) if device == "cuda" else (("tiny", "smollm2") if fast
                                                       else ("tiny", "gpt2"))
        # the smoke run: SmolLM2's architecture in FAST_LAYERS layers
        if fast and device == "cpu" and layers is None:
            layers = FAST_LAYERS
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    figures: dict[str, Any] = {"device": device, "dtype": dtype,
                               "load_avg_1min": os.getloadavg()[0]}
    details: dict[str, Any] = {}
    for size in sizes:
        results = {}
        for side in sides:
            results[side] = run_side(side, size, device, dtype, batch, new_tokens,
                                     fast, layers=layers)
            if verbose:
                r = results[side]
                peak = r.get("cuda_peak_mb", r["peak_above_baseline_mb"])
                print(f"  {size:8s} {side:9s} params {r['param_bytes']['total'] / 2**20:9.1f} MB  "
                      f"peak {peak:9.1f} MB  ({r['cpu_s']:.1f} CPU s, {r['wall_s']:.1f} wall "
                      "s)", flush=True)
        figures.update(compare(results, size))
        estimate = ppo_estimate(results["shared"]["spec"], dtype, device)
        # rlhf_helpers.ppo.model.memory_estimate's estimate next to the shared side's measured peak
        if estimate is not None:
            figures[f"{size}_shared_estimate_mb"] = estimate.total / 2**20
            if verbose:
                print(f"  {size:8s} shared    estimate {estimate.total / 2**20:9.1f} MB (peak at "
                      f"{estimate.phase}) against the measured peak above", flush=True)
        figures[f"{size}_batch"] = results["shared"]["spec"]["batch"]
        figures[f"{size}_new_tokens"] = results["shared"]["spec"]["new_tokens"]
        # fast: a shrunken stack
        figures[f"{size}_layers"] = results["shared"]["spec"].get("layers") or "all"
        details[size] = results
    figures["load_avg_1min_end"] = os.getloadavg()[0]
    return figures, details


def main(fast: bool = False, device: str = "cpu", sizes: tuple[str, ...] | None = None,
         sides: tuple[str, ...] = SIDES, dtype: str | None = None, batch: int | None = None,
         new_tokens: int | None = None, layers: int | None = None) -> dict[str, Any]:
    """Flat figures (MB per side, shared/four ratios, goal) of `measure_all`."""
    return measure_all(fast, device, sizes, sides, dtype, batch, new_tokens, layers=layers)[0]


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true",
                        help="smaller steps; without --sizes on the CPU: the tiny size and smollm2 "
                             "with 2 layers")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--sizes", default=None, help="comma-separated: tiny, gpt2, smollm2")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help=f"comma-separated subset of {SIDES}")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bf16 on cuda)")
    parser.add_argument("--batch", type=int, default=None, help="override the size's batch")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="override the size's max new tokens")
    parser.add_argument("--layers", type=int, default=None,
                        help="transformer layers of gpt2/smollm2 (default: all; --fast alone on "
                             "the CPU: 2)")
    parser.add_argument("--json", default=None,
                        help="write every figure of every side to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = tuple(args.sizes.split(",")) if args.sizes else None
    if args.worker:  # one side in this process; its figures as the last line of stdout
        dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
        print(json.dumps(measure_side(args.worker, sizes[0], args.device, dtype, args.batch,
                                      args.new_tokens, args.fast, layers=args.layers)))
        return
    figures, details = measure_all(args.fast, args.device, sizes, tuple(args.sides.split(",")),
                                   args.dtype, args.batch, args.new_tokens, layers=args.layers)
    for key, value in figures.items():
        print(f"  {key:45s} {value:.4g}" if isinstance(value, float) else f"  {key:45s} {value}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"figures": figures, "details": details}, indent=2) + "\n")


if __name__ == "__main__":
    cli()
