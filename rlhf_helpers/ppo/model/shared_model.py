"""One base LM, four PPO roles: policy, value and reward LoRA adapters, the bare base as reference.

    shared = SharedLoRAModel(base_lm, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                             reward_dir="runs/reward")  # the reward step's adapter + score head
    logp = shared.policy_logprobs(seq, attn, P)  # (B, R) with the policy adapter
    ref = shared.ref_logprobs(seq, attn, P)      # (B, R) with every adapter disabled
    v = shared.values(seq, attn, P)              # (B, R) value adapter + value head
    r = shared.reward_scores(seq, attn)          # (B,) reward adapter + score head, last real token
    seq, logp, ent = sampling.sample_model(shared, prompt_ids, prompt_attn, 40, with_logprobs=True)

Sequences are left-padded prompts of width P followed by responses of width R = L - P; `attn` (B, L)
is 1 on real tokens. Per-token outputs (B, R) are aligned with the response tokens: position t of
the output belongs to token seq[:, P + t] and is read from the hidden state at P + t - 1 (the state
before that token is chosen).

The stack's known traps, handled here:
- peft's `set_adapter` makes only the active adapter trainable; `use` restores `requires_grad` from
  the adapter names after every switch, and `policy_parameters` / `value_parameters` pick parameters
  by adapter name, never by whatever happens to be trainable.
- gradient checkpointing re-runs forwards during backward, possibly under another adapter: refused.
- GPT-2 does not derive position ids from a left-padded mask: every forward passes them.
- dropout: the module stays in eval mode (`train()` is a no-op), so two forwards agree exactly.
- pad must differ from EOS, or the EOS of every response would be masked as padding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from rlhf_helpers.core.checks import check_temperature, check_token_batch
from rlhf_helpers.core.logprobs import entropy_from_logits, logprobs_from_logits
from rlhf_helpers.core.tokens import last_token_index, mask_to_first_eos, position_ids_from_mask
from rlhf_helpers.ppo.model.adapters import params_by_adapter, refuse_checkpointing
from rlhf_helpers.ppo.model.fast_decoder import StaticLlamaDecoder, supports_fast_decoder
from rlhf_helpers.ppo.model.fused_lora import fuse_lora_layers, fuse_tanh_gelu
from rlhf_helpers.ppo.model.packed_gpt2 import packed_hidden, supports_packed
from rlhf_helpers.ppo.model.shared_adapters import attach_adapters, check_special_tokens
from rlhf_helpers.runtime.lora import LoRASpec, as_lora_spec

#: The trained adapters, and the frozen one.
TRAINED_ADAPTERS = ("policy", "value")
FROZEN_ADAPTERS = ("reward",)
ADAPTERS = TRAINED_ADAPTERS + FROZEN_ADAPTERS


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The logits of the distribution that samples at `temperature`: z / T, in float32 at least.

    pi_T(v) = softmax(z / T)_v. At T = 1 the logits come back unchanged (same tensor): the default
    path adds no cast and no division.
    """
    if temperature == 1.0:
        return logits
    return logits.float() / temperature


def _check_context(context_length: int, length: int) -> None:
    if not 1 <= context_length < length:
        raise ValueError(f"context_length must be in [1, {length}) (prompt width before the "
                         f"response), got {context_length}")


class SharedLoRAModel(nn.Module):
    """A causal LM with `policy`, `value` and `reward` LoRA adapters, a value head and a score head.

    Speed paths, each the same maths to float rounding (False: off, bit for bit the plain path):
    `fused_gelu` GPT-2's gelu_new as one kernel (`fuse_tanh_gelu`); `fused_lora` each float32 LoRA
    layer as one product, the adapter folded into a copy of the base weight (`fuse_lora_layers`);
    `packed` GPT-2's forwards and sampling on the real tokens only (`packed_gpt2.py`, hidden state
    0 at padding; other architectures keep transformers' forward).
    `fast_sampling`: sample with `sampling.StaticLlamaDecoder` (static KV cache, adapter folded into
    the weights, one CUDA graph per decode step); None (default) does so on CUDA for Llama-family
    models, else the plain KV-cached loop.
    """

    def __init__(
        self,
        base_model: nn.Module,
        pad_token_id: int,
        eos_token_id: int,
        lora: LoRASpec | None = None,
        reward_dir: str | Path | None = None,
        seed: int = 0,
        fused_gelu: bool = True,
        fused_lora: bool = True,
        fast_sampling: bool | None = None,
        packed: bool = True,
    ) -> None:
        super().__init__()
        check_special_tokens(pad_token_id, eos_token_id)
        refuse_checkpointing(base_model)
        if fused_gelu:  # same activation, one kernel instead of eight ops (see fuse_tanh_gelu)
            fuse_tanh_gelu(base_model)
        self.pad_token_id = int(pad_token_id)  #: id of the padding token
        self.eos_token_id = int(eos_token_id)  #: id of the end-of-sequence token
        #: the spec of the policy and value adapters
        self.lora = as_lora_spec(lora if lora is not None else LoRASpec())
        self.peft, self.value_head, self.score_head = attach_adapters(base_model, self.lora,
                                                                      reward_dir, seed)
        device = next(base_model.parameters()).device
        self.value_head.to(device=device, dtype=torch.float32)
        self.score_head.to(device=device, dtype=torch.float32)
        self.peft.to(device)
        if fused_lora:  # same maths, one product per LoRA layer instead of three (fused_lora.py)
            fuse_lora_layers(self.peft)
        self._adapter_params = params_by_adapter(self.peft, ADAPTERS)
        self._lora_layers = [m for m in self.peft.modules() if isinstance(m, BaseTunerLayer)]
        # transformers turns checkpointing on only in modules that have the flag: these, found once
        self._checkpointable = [m for m in self.lm.modules()
                                if hasattr(m, "gradient_checkpointing")]
        self._active: str | None = None
        if fast_sampling and not supports_fast_decoder(self.lm):
            raise ValueError(
                "fast_sampling=True needs a Llama-family model (sampling.FAST_MODEL_TYPES)")
        #: sample with the static-cache decoder (CUDA graphs on a GPU); None: on CUDA when supported
        self.fast_sampling = (device.type == "cuda" and supports_fast_decoder(self.lm)
                              if fast_sampling is None else bool(fast_sampling))
        #: the static-cache decoder `sampling.sample_model` builds on first use (fast_sampling only)
        self.fast_decoder: StaticLlamaDecoder | None = None
        self.score_head.requires_grad_(False)
        self.use("policy")
        super().train(False)  # dropout off for good
        #: GPT-2 on the real tokens only (packed_gpt2.py)
        self.packed = packed and supports_packed(self.lm)

    # ------------------------------------------------------------------ adapters and parameters
    def _restore_trainable(self) -> None:
        """requires_grad by adapter name: policy and value trainable, reward and the base frozen."""
        for adapter, params in self._adapter_params.items():
            for param in params:
                param.requires_grad_(adapter in TRAINED_ADAPTERS)

    def use(self, adapter: str) -> None:
        """Activate one adapter, then undo what `set_adapter` did to requires_grad."""
        if adapter not in ADAPTERS:
            raise ValueError(f"adapter must be one of {ADAPTERS}, got {adapter!r}")
        if adapter != self._active:
            # checkpointing switched on after construction would rerun forwards under other adapters
            refuse_checkpointing(self._checkpointable)
            # peft's model-wide set_adapter walks every module twice (about 4 ms on the tiny model,
            # 32 switches per update); its per-layer set_adapter on the LoRA layers, found once, is
            # the same switch (this model's peft config has no modules_to_save, the only other
            # thing it sets)
            self._active = None  # a switch cut short (Ctrl-C) is redone whole by the next call
            for layer in self._lora_layers:
                layer.set_adapter(adapter)
            self.peft.base_model.active_adapter = adapter
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

    @property
    def compute_dtype(self) -> torch.dtype:
        """dtype of the frozen base weights (the forward's matmuls); adapters, heads: float32."""
        return self.lm.get_input_embeddings().weight.dtype

    # ------------------------------------------------------------------ forwards
    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.packed:  # GPT-2 on the real tokens only (packed_gpt2.py): 0 at padding positions
            return packed_hidden(self.backbone, input_ids, attention_mask)  # (B, L, H)
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids_from_mask(attention_mask), use_cache=False)
        return out.last_hidden_state  # (B, L, H)

    def _logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                logits_to_keep: int | torch.Tensor = 0) -> torch.Tensor:
        """(B, L) -> (B, L, V), or (B, K, V) at the K positions in `logits_to_keep` (0: all)."""
        if self.packed:
            hidden = self._hidden(input_ids, attention_mask)  # (B, L, H)
            if torch.is_tensor(logits_to_keep):
                kept = hidden[:, logits_to_keep]
            else:  # an int k keeps the last k, as transformers does
                kept = hidden[:, -logits_to_keep:]
            return self.lm.lm_head(kept)  # (B, L or K, V)
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
        positions = torch.arange(context_length - 1, input_ids.shape[1] - 1,
                                 device=input_ids.device)  # (R,)
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

    def policy_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits of the policy (policy adapter on): (B, L) -> (B, L, V)."""
        check_token_batch(input_ids, attention_mask)
        self.use("policy")
        return self._logits(input_ids, attention_mask)

    def policy_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        context_length: int, with_entropy: bool = False, entropy_grad: bool = True,
                        temperature: float = 1.0):
        """log pi_theta(y_t | prompt, y_<t) of the response: (B, L) -> (B, R) [, entropy (B, R)].

        `entropy_grad=False`: the entropy carries no gradient (for a loss without an entropy bonus).
        `temperature`: of the distribution softmax(z / T) that sampled the tokens (see `generate`).
        """
        _check_context(context_length, input_ids.shape[1])
        check_token_batch(input_ids, attention_mask)
        check_temperature(temperature)
        self.use("policy")
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
        check_token_batch(input_ids, attention_mask)
        _check_context(context_length, input_ids.shape[1])
        check_temperature(temperature)
        with torch.no_grad(), self.reference():
            logits = self._response_logits(input_ids, attention_mask, context_length)  # (B, R, V)
        return self._logprobs_of(logits, input_ids[:, context_length:], False,
                                 temperature=temperature)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               context_length: int) -> torch.Tensor:
        """V(s_t) before each response token (value adapter + value head): (B, L) -> (B, R)."""
        check_token_batch(input_ids, attention_mask)
        _check_context(context_length, input_ids.shape[1])
        self.use("value")
        hidden = self._hidden(input_ids, attention_mask)  # (B, L, H)
        return self.value_head(hidden[:, context_length - 1 : -1])  # (B, R)

    def reward_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Reward score at each row's last real token (reward adapter, no grad): (B, L) -> (B,)."""
        check_token_batch(input_ids, attention_mask)
        self.use("reward")
        with torch.no_grad():
            hidden = self._hidden(input_ids, attention_mask)  # (B, L, H)
            last = last_token_index(attention_mask)  # (B,)
            picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, H)
            return self.score_head(picked[:, None, :])[:, 0]  # (B,)

    def response_mask(self, responses: torch.Tensor) -> torch.Tensor:
        """1 on response tokens up to and including the first EOS, 0 after it: (B, R) -> (B, R)
        float (`core.tokens.mask_to_first_eos`: only the EOS decides where a response ends)."""
        if responses.ndim != 2:
            raise ValueError(f"responses must have shape (B, R), got {tuple(responses.shape)}")
        return mask_to_first_eos(responses, self.eos_token_id)  # (B, R)

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
                           for head in (self.value_head, self.score_head)
                           for p in head.parameters())
        out["total"] = sum(out.values())
        return out
