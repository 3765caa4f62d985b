"""One base causal LM, four PPO roles: policy, value and reward LoRA adapters, and the bare base as reference.

    shared = SharedLoRAModel(base_lm, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                             reward_dir="runs/reward")           # the reward step's adapter + score head
    logp = shared.policy_logprobs(seq, attn, P)    # (B, R) with the policy adapter
    ref = shared.ref_logprobs(seq, attn, P)        # (B, R) with every adapter disabled
    v = shared.values(seq, attn, P)                # (B, R) value adapter + value head
    r = shared.reward_scores(seq, attn)            # (B,) reward adapter + score head, last real token
    seq, logp, ent = shared.generate_with_logprobs(prompt_ids, prompt_attn, max_new_tokens=40)

Sequences are left-padded prompts of width P followed by responses of width R = L - P; `attn` (B, L)
is 1 on real tokens. Per-token outputs (B, R) are aligned with the response tokens: position t of the
output belongs to token seq[:, P + t] and is read from the hidden state at P + t - 1 (the state
before that token is chosen).

The stack's traps, handled here (COURSE_SPEC section 5):
- peft's `set_adapter` makes only the active adapter trainable; `_use` restores `requires_grad` from
  the adapter names after every switch, and `policy_parameters` / `value_parameters` pick parameters
  by adapter name, never by whatever happens to be trainable.
- gradient checkpointing re-runs forwards during backward, possibly under another adapter: refused.
- GPT-2 does not derive position ids from a left-padded mask: every forward passes them.
- dropout: the module stays in eval mode (`train()` is a no-op), so two forwards agree exactly.
- pad must differ from EOS, or the EOS of every response would be masked as padding.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhf_helpers._checks import validation
from rlhf_helpers.kl import last_token_index
from rlhf_helpers.logprobs import entropy_from_logits, logprobs_from_logits
from rlhf_helpers.ppo.fused_lora import fuse_lora_layers
from rlhf_helpers.ppo.value_head import ScalarHead

#: The trained adapters, and the frozen one.
TRAINED_ADAPTERS = ("policy", "value")
FROZEN_ADAPTERS = ("reward",)
ADAPTERS = TRAINED_ADAPTERS + FROZEN_ADAPTERS
#: File names of the reward step's output read by `SharedLoRAModel` (see reward_training.py).
SCORE_HEAD_FILE = "score_head.safetensors"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only: (B, L) 0/1 mask -> (B, L), 0 at left padding.

    pos_t = (sum_{s <= t} m_s) - 1, clamped at 0; a left-padded row starts at position 0 on its first
    real token, exactly as the same row without padding would.
    """
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, L)


def uses_conv1d(model: nn.Module) -> bool:
    """True for GPT-2-style models whose projections are transformers' Conv1D (weights stored (in, out))."""
    return any(type(module).__name__ == "Conv1D" for module in model.modules())


def lora_config(r: int, alpha: int, target_modules: tuple[str, ...] | list[str],
                fan_in_fan_out: bool = False, task_type: str = "CAUSAL_LM") -> Any:
    """A LoRA config with dropout 0 (PPO compares two forwards of the same input)."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(target_modules),
                      bias="none", task_type=task_type, fan_in_fan_out=fan_in_fan_out)


def fuse_tanh_gelu(model: nn.Module) -> int:
    """Swap transformers' `NewGELUActivation` (GPT-2's "gelu_new") for torch's fused tanh-GELU, in place.

    gelu(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))     (the same formula on both sides)

    gelu_new evaluates it as eight separate tensor ops, each reading and writing the (B, L, 4H) MLP
    activation and saving it for backward; `F.gelu(approximate="tanh")` is one kernel forward and one
    backward. Outputs differ only by float rounding (about 1e-7). Returns how many modules were swapped.
    """
    from transformers.activations import GELUTanh, NewGELUActivation

    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is NewGELUActivation]
    for name, _ in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, GELUTanh())
    return len(targets)


def _refuse_checkpointing(model: nn.Module) -> None:
    """ValueError if any module of `model` has gradient (activation) checkpointing on."""
    if any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules()):
        raise ValueError("gradient checkpointing must be off: its re-run forward during backward may "
                         "use another adapter than the forward did, giving silently wrong gradients")


def _check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape (B, L), got {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(attention_mask.shape)}")
    if not bool(attention_mask.bool().any(dim=1).all()):
        raise ValueError("attention_mask has a row with no real token")


def _check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) \
            or not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The logits of the distribution that samples at `temperature`: z / T, in float32 at least.

    pi_T(v) = softmax(z / T)_v. At T = 1 the logits come back unchanged (same tensor), so the
    default path computes exactly what it did before temperatures were supported.
    """
    if temperature == 1.0:
        return logits
    return logits.float() / temperature


def _check_context(context_length: int, length: int) -> None:
    if not 1 <= context_length < length:
        raise ValueError(f"context_length must be in [1, {length}) (prompt width before the response), "
                         f"got {context_length}")


class SharedLoRAModel(nn.Module):
    """A causal LM with `policy`, `value` and `reward` LoRA adapters, a value head and a score head.

    `fused_gelu=True` (default) swaps GPT-2's gelu_new for torch's fused kernel of the same formula
    (`fuse_tanh_gelu`; outputs agree to float rounding); False keeps the base model's ops bit for bit.
    `fused_lora=True` (default) runs each float32 LoRA layer as one product with the adapter folded
    into a copy of the base weight (`fused_lora.fuse_lora_layers`; same outputs and gradients up to
    float rounding); False keeps peft's own forward.
    """

    def __init__(
        self,
        base_model: nn.Module,
        pad_token_id: int,
        eos_token_id: int,
        r: int = 8,
        lora_alpha: int = 16,
        target_modules: tuple[str, ...] | list[str] = ("c_attn", "c_proj", "c_fc"),
        reward_dir: str | Path | None = None,
        seed: int = 0,
        fused_gelu: bool = True,
        fused_lora: bool = True,
    ) -> None:
        super().__init__()
        from peft import get_peft_model

        if pad_token_id is None or eos_token_id is None:
            raise ValueError("pad_token_id and eos_token_id must both be set")
        if pad_token_id == eos_token_id:
            raise ValueError(f"pad_token_id must differ from eos_token_id (both {pad_token_id}): with "
                             "pad == EOS, masks built from the pad id hide the EOS of every response")
        _refuse_checkpointing(base_model)
        if fused_gelu:  # same activation, one kernel instead of eight ops (see fuse_tanh_gelu)
            fuse_tanh_gelu(base_model)
        self.pad_token_id = int(pad_token_id)  #: id of the padding token
        self.eos_token_id = int(eos_token_id)  #: id of the end-of-sequence token
        hidden_size = base_model.config.get_text_config().hidden_size
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)  # adapter and head initialisation do not depend on the caller's RNG
        self._fan_in_fan_out = uses_conv1d(base_model)
        try:
            config = lora_config(r, lora_alpha, target_modules, self._fan_in_fan_out)
            with warnings.catch_warnings():  # peft reads transformers' deprecated checkpointing flag
                warnings.simplefilter("ignore", FutureWarning)
                self.peft = get_peft_model(base_model, config, adapter_name="policy")
            self.peft.add_adapter("value", lora_config(r, lora_alpha, target_modules, self._fan_in_fan_out))
            self.value_head = ScalarHead(hidden_size, bias=True, init_std=1e-2)
            if reward_dir is None:
                self.peft.add_adapter("reward", lora_config(r, lora_alpha, target_modules,
                                                            self._fan_in_fan_out))
                self.score_head = ScalarHead(hidden_size, bias=False, init_std=1.0 / hidden_size**0.5)
            else:
                self.score_head = self._load_reward(Path(reward_dir), hidden_size)
        finally:
            torch.random.set_rng_state(generator_state)
        device = next(base_model.parameters()).device
        self.value_head.to(device=device, dtype=torch.float32)
        self.score_head.to(device=device, dtype=torch.float32)
        self.peft.to(device)
        if fused_lora:  # same maths, one product per LoRA layer instead of three (see fused_lora.py)
            fuse_lora_layers(self.peft)
        self._adapter_params = self._params_by_adapter()
        self._active: str | None = None
        self.score_head.requires_grad_(False)
        self._use("policy")
        super().train(False)  # dropout off for good

    # ------------------------------------------------------------------ construction helpers
    def _load_reward(self, directory: Path, hidden_size: int) -> ScalarHead:
        """Add the frozen `reward` adapter from the reward step's folder; return its score head."""
        import json

        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = directory / ADAPTER_WEIGHTS_FILE
        head_file = directory / SCORE_HEAD_FILE
        config_file = directory / "adapter_config.json"
        for path in (weights, head_file, config_file):
            if not path.is_file():
                raise FileNotFoundError(f"reward_dir lacks {path.name}: {directory} must be written by "
                                        "rlhf_helpers.ppo.reward_training.train_reward_model")
        saved = json.loads(config_file.read_text())
        self.peft.add_adapter("reward", lora_config(saved["r"], saved["lora_alpha"],
                                                     sorted(saved["target_modules"]),
                                                     self._fan_in_fan_out))
        state = {k: v for k, v in load_file(str(weights)).items() if "lora_" in k}
        result = set_peft_model_state_dict(self.peft, state, adapter_name="reward")
        missing = [k for k in result.missing_keys if ".reward." in k and "lora_" in k]
        if missing or not state:
            raise ValueError(f"reward adapter in {directory} does not fit this base model "
                             f"(missing {missing[:3]}...)")
        head = load_file(str(head_file))
        if head["weight"].shape != (1, hidden_size):
            raise ValueError(f"score head weight must have shape (1, {hidden_size}), got "
                             f"{tuple(head['weight'].shape)}")
        score = ScalarHead(hidden_size, bias="bias" in head)
        score.linear.load_state_dict(head)
        return score

    def _params_by_adapter(self) -> dict[str, list[nn.Parameter]]:
        found: dict[str, list[nn.Parameter]] = {name: [] for name in ADAPTERS}
        for name, param in self.peft.named_parameters():
            if "lora_" not in name:
                continue
            for adapter in ADAPTERS:
                if f".{adapter}." in name or name.endswith(f".{adapter}"):
                    found[adapter].append(param)
        for adapter, params in found.items():
            if not params:
                raise ValueError(f"no LoRA parameters found for adapter {adapter!r}: check target_modules")
        return found

    # ------------------------------------------------------------------ adapters and parameters
    def _restore_trainable(self) -> None:
        """requires_grad by adapter name: policy and value trainable, reward and the base frozen."""
        for adapter, params in self._adapter_params.items():
            for param in params:
                param.requires_grad_(adapter in TRAINED_ADAPTERS)

    def _use(self, adapter: str) -> None:
        """Activate one adapter, then undo what `set_adapter` did to requires_grad."""
        if adapter not in ADAPTERS:
            raise ValueError(f"adapter must be one of {ADAPTERS}, got {adapter!r}")
        if adapter != self._active:
            # checkpointing switched on after construction would re-run forwards under another adapter
            _refuse_checkpointing(self.lm)
            self.peft.base_model.set_adapter(adapter)
            self._active = adapter
        self._restore_trainable()

    def policy_parameters(self) -> list[nn.Parameter]:
        """The policy adapter's LoRA matrices (what the policy optimiser updates)."""
        return list(self._adapter_params["policy"])

    def value_parameters(self) -> list[nn.Parameter]:
        """The value adapter's LoRA matrices and the value head."""
        return list(self._adapter_params["value"]) + list(self.value_head.parameters())

    def adapter_parameters(self, adapter: str) -> list[nn.Parameter]:
        """The LoRA matrices of one adapter by name."""
        if adapter not in ADAPTERS:
            raise ValueError(f"adapter must be one of {ADAPTERS}, got {adapter!r}")
        return list(self._adapter_params[adapter])

    def train(self, mode: bool = True) -> SharedLoRAModel:
        """No-op: the model stays in eval mode so dropout never makes two forwards differ."""
        return self

    @property
    def lm(self) -> nn.Module:
        """The underlying causal LM (with LoRA layers injected)."""
        return self.peft.base_model.model

    @property
    def backbone(self) -> nn.Module:
        """The transformer without its LM head (GPT-2: `.transformer`, Llama: `.model`)."""
        return getattr(self.lm, self.lm.base_model_prefix)

    @property
    def device(self) -> torch.device:
        return next(self.peft.parameters()).device

    # ------------------------------------------------------------------ forwards
    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids_from_mask(attention_mask), use_cache=False)
        return out.last_hidden_state  # (B, L, H)

    def _logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                logits_to_keep: int | torch.Tensor = 0) -> torch.Tensor:
        """(B, L) -> (B, L, V), or (B, K, V) at the K positions listed in `logits_to_keep` (0: all)."""
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids_from_mask(attention_mask), use_cache=False,
                      logits_to_keep=logits_to_keep)
        return out.logits  # (B, L or K, V)

    def _response_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         context_length: int) -> torch.Tensor:
        """Logits that predict the response tokens, and only those: (B, L) -> (B, R, V).

        The LM head runs on the hidden states at positions P - 1 ... L - 2 only (the prompt's other
        positions predict prompt tokens, which nobody reads). They are passed as an index tensor,
        which gathers them into a contiguous (B, R, H) block: a strided slice there makes the CPU
        matmul several times slower and, in bf16, copies the whole (V, H) head weight to float32.
        """
        positions = torch.arange(context_length - 1, input_ids.shape[1] - 1, device=input_ids.device)  # (R,)
        return self._logits(input_ids, attention_mask, logits_to_keep=positions)  # (B, R, V)

    @staticmethod
    def _logprobs_of(response_logits: torch.Tensor, response_ids: torch.Tensor, with_entropy: bool,
                     entropy_grad: bool = True, temperature: float = 1.0):
        response_logits = tempered(response_logits, temperature)  # (B, R, V)
        logp = logprobs_from_logits(response_logits, response_ids)  # (B, R)
        if not with_entropy:
            return logp
        if not entropy_grad:  # a statistic only: backward skips the softmax over the vocabulary
            response_logits = response_logits.detach()
        return logp, entropy_from_logits(response_logits)  # (B, R), (B, R)

    def _response_logprobs(self, logits: torch.Tensor, input_ids: torch.Tensor, context_length: int,
                           with_entropy: bool):
        # logits at position s give the distribution of token s + 1
        response_logits = logits[:, context_length - 1 : -1]  # (B, R, V)
        return self._logprobs_of(response_logits, input_ids[:, context_length:], with_entropy)

    def policy_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits of the policy (policy adapter on): (B, L) -> (B, L, V)."""
        _check_inputs(input_ids, attention_mask)
        self._use("policy")
        return self._logits(input_ids, attention_mask)

    def policy_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        context_length: int, with_entropy: bool = False, entropy_grad: bool = True,
                        temperature: float = 1.0):
        """log pi_theta(y_t | prompt, y_<t) of the response tokens: (B, L) -> (B, R) [, entropy (B, R)].

        `entropy_grad=False`: the entropy carries no gradient (for a loss without an entropy bonus).
        `temperature`: of the distribution softmax(z / T) that sampled the tokens (see `generate`).
        """
        _check_context(context_length, input_ids.shape[1])
        _check_inputs(input_ids, attention_mask)
        _check_temperature(temperature)
        self._use("policy")
        logits = self._response_logits(input_ids, attention_mask, context_length)  # (B, R, V)
        return self._logprobs_of(logits, input_ids[:, context_length:], with_entropy, entropy_grad,
                                 temperature)

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Inside this block the model is the reference: the base with every adapter disabled.

        Leaving peft's `disable_adapter` block re-enables the layers and resets `requires_grad` to
        "only the active adapter trains", so the adapter-name rule is restored afterwards.
        """
        try:
            with self.peft.disable_adapter():
                yield
        finally:
            self._restore_trainable()

    def ref_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     context_length: int, temperature: float = 1.0) -> torch.Tensor:
        """log pi_ref(y_t | prompt, y_<t) (adapters disabled, no gradient): (B, L) -> (B, R).

        `temperature`: the reference at the same temperature as the policy, softmax(z_ref / T), so
        that the KL penalty compares the two distributions the same way (see PPOConfig.temperature).
        """
        _check_inputs(input_ids, attention_mask)
        _check_context(context_length, input_ids.shape[1])
        _check_temperature(temperature)
        with torch.no_grad(), self.reference():
            logits = self._response_logits(input_ids, attention_mask, context_length)  # (B, R, V)
        return self._logprobs_of(logits, input_ids[:, context_length:], False, temperature=temperature)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               context_length: int) -> torch.Tensor:
        """V(s_t) before each response token (value adapter + value head): (B, L) -> (B, R)."""
        _check_inputs(input_ids, attention_mask)
        _check_context(context_length, input_ids.shape[1])
        self._use("value")
        hidden = self._hidden(input_ids, attention_mask)  # (B, L, H)
        return self.value_head(hidden[:, context_length - 1 : -1])  # (B, R)

    def reward_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Reward-model score at each row's last real token (reward adapter, no gradient): (B, L) -> (B,)."""
        _check_inputs(input_ids, attention_mask)
        self._use("reward")
        with torch.no_grad():
            hidden = self._hidden(input_ids, attention_mask)  # (B, L, H)
            last = last_token_index(attention_mask)  # (B,)
            picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, H)
            return self.score_head(picked[:, None, :])[:, 0]  # (B,)

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 temperature: float = 1.0, adapter: str | None = "policy") -> torch.Tensor:
        """Sample responses to left-padded prompts with a KV cache: (B, P) -> (B, P + R), R <= max_new_tokens.

        y_t ~ softmax(z_t / temperature): no top-k, no top-p (PPO needs the policy's own distribution).
        A row stops after its EOS; later positions hold pad. `adapter=None` samples the reference.
        Uses the global torch RNG (seeded by the caller). NaN/inf logits (broken weights) raise
        ValueError "... must be finite ..." after the loop instead of crashing `torch.multinomial`.
        """
        return self._generate(input_ids, attention_mask, max_new_tokens, temperature, adapter, False)[0]

    @torch.no_grad()
    def generate_with_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                               max_new_tokens: int, temperature: float = 1.0, adapter: str | None = "policy",
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`generate`, plus the log-prob and the entropy of the sampling model at every sampled token:
        (B, P) -> sequences (B, P + R), log pi(y_t | prompt, y_<t) (B, R), H_t (B, R).

        Both are read from the logits the sampling loop computes anyway, so the rollout needs no
        second policy forward. They belong to the distribution that sampled the tokens,
        softmax(z / temperature), and equal `policy_logprobs(seq, attn, P, with_entropy=True,
        temperature=temperature)` of the returned sequences up to float rounding on every token up
        to and including EOS: same positions (counted over real tokens), same attended tokens, one
        KV-cached token per step instead of one full pass. After a row's EOS they belong to pad
        (meaningless, finite, masked by every consumer). Same random draws as `generate`.
        """
        sequences, logprobs, entropy = self._generate(input_ids, attention_mask, max_new_tokens,
                                                      temperature, adapter, True)
        return sequences, logprobs, entropy

    def _generate(self, input_ids, attention_mask, max_new_tokens, temperature, adapter, with_logprobs):
        _check_inputs(input_ids, attention_mask)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        _check_temperature(temperature)
        if adapter is None:
            with self.reference():
                return self._sample(input_ids, attention_mask, max_new_tokens, temperature, with_logprobs)
        self._use(adapter)
        return self._sample(input_ids, attention_mask, max_new_tokens, temperature, with_logprobs)

    def _sample(self, input_ids, attention_mask, max_new_tokens, temperature, with_logprobs):
        batch = input_ids.shape[0]
        mask = attention_mask.long()  # (B, P + t)
        positions = position_ids_from_mask(mask)  # (B, P)
        last = torch.tensor([input_ids.shape[1] - 1], device=input_ids.device)  # (1,) see _response_logits
        out = self.lm(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                      logits_to_keep=last)  # only the last prompt position predicts a response token
        past = out.past_key_values
        next_pos = positions[:, -1:] + 1  # (B, 1)
        logits = out.logits[:, -1]  # (B, V)
        done = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)  # (B,)
        broken = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)  # (B,) met a NaN/inf logit
        tokens, logprobs, entropies = [], [], []
        for step in range(max_new_tokens):
            # pi_T(v) = softmax(z / T)_v: the distribution that draws the token
            scaled = logits.float() / temperature  # (B, V)
            finite = torch.isfinite(scaled).all(dim=-1)  # (B,)
            broken = broken | ~finite
            # a NaN/inf row would crash multinomial (CPU) or trip a device assert (CUDA): it draws from
            # zeros instead, and the flag, read once with the loop's own stop test, raises after the loop
            scaled = torch.where(finite[:, None], scaled, torch.zeros_like(scaled))  # (B, V)
            token = torch.multinomial(torch.softmax(scaled, dim=-1), 1).squeeze(-1)  # (B,)
            token = torch.where(done, torch.full_like(token, self.pad_token_id), token)
            tokens.append(token)
            if with_logprobs:  # log pi_T(y_t) and H_t of the sampling distribution at this step
                step_logits = scaled[:, None]  # (B, 1, V)
                with validation(False):  # tokens are in range and `broken` covers NaN: no sync per token
                    logprobs.append(logprobs_from_logits(step_logits, token[:, None])[:, 0])  # (B,)
                    entropies.append(entropy_from_logits(step_logits)[:, 0])  # (B,)
            done = done | (token == self.eos_token_id)
            if bool(done.all() | broken.any()) or step == max_new_tokens - 1:
                break
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)  # (B, P + t + 1)
            out = self.lm(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos,
                          past_key_values=past, use_cache=True)
            past = out.past_key_values
            next_pos = next_pos + 1
            logits = out.logits[:, -1]  # (B, V)
        if bool(broken.any()):
            raise ValueError(f"sampling logits must be finite, but {int(broken.sum())} of {batch} rows met "
                             f"NaN or inf at response token {step} (the weights are broken)")
        sequences = torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)  # (B, P + R)
        if not with_logprobs:
            return sequences, None, None
        return sequences, torch.stack(logprobs, dim=1), torch.stack(entropies, dim=1)  # (B, R) each

    def response_mask(self, responses: torch.Tensor) -> torch.Tensor:
        """1 on response tokens up to and including the first EOS, 0 after it: (B, R) -> (B, R) float.

        Only the EOS decides where a response ends: `generate` writes pad after it, but a pad id the
        policy itself sampled before any EOS is a real token of the response (the policy gave it
        probability), so masking it would punch a hole in the mask.
        """
        if responses.ndim != 2:
            raise ValueError(f"responses must have shape (B, R), got {tuple(responses.shape)}")
        is_eos = (responses == self.eos_token_id).long()  # (B, R)
        after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0  # (B, R)
        return (~after_eos).float()  # (B, R)

    # ------------------------------------------------------------------ memory
    def parameter_bytes(self) -> dict[str, int]:
        """Bytes of the base weights, of each adapter, and of the heads."""
        adapter_ids = {id(p) for params in self._adapter_params.values() for p in params}
        base = sum(p.numel() * p.element_size() for p in self.peft.parameters()
                   if id(p) not in adapter_ids)
        out = {"base": base}
        for adapter, params in self._adapter_params.items():
            out[adapter] = sum(p.numel() * p.element_size() for p in params)
        out["heads"] = sum(p.numel() * p.element_size()
                           for head in (self.value_head, self.score_head) for p in head.parameters())
        out["total"] = sum(out.values())
        return out
