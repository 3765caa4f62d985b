"""Estimated GPU memory of the gpu profile's training stages, without a GPU.

The peak memory of the gpu profile's three training stages (full SFT, reward-model training, one PPO
iteration), counted from the model's shape and the profile's batch sizes: a check that each fits a
Colab T4 (15 GiB) before any GPU runs it. Every term counts the bytes of tensors alive together at
the stage's peak; benchmarks/bench_memory.py prints the PPO estimate next to the measured CUDA peak.

  estimates = estimate_memory(get_profile("gpu"))      # {"sft": ..., "reward": ..., "ppo": ...}
  estimates["ppo"].total / 2**30                        # GiB
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhf_helpers.ppo.model.fast_decoder import CACHE_ROUND, MAX_GRAPHS
from rlhf_helpers.runtime.architectures import architecture_of
from rlhf_helpers.runtime.precision import resolve_dtype

#: Usable memory of a Colab T4 (15 GiB of its 16; `nvidia-smi` reports 15360 MiB).
T4_MEMORY_BYTES = 15 * 2**30
#: Bytes of one float32 number: master weights, gradients, Adam moments, log-softmax inputs.
FLOAT32_BYTES = 4
#: Bytes of a saved int64 token index (full fine-tuning's embedding lookup keeps its input ids).
INDEX_BYTES = 8
#: TRL >= 1.16's fused LM head (SFTTrainer) projects at most this many tokens at a time...
TRL_TOKEN_TILE = 4096
#: ...onto at most this many vocabulary entries (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE).
TRL_VOCAB_TILE = 32768
#: LoRA target module names of a Llama layer, grouped by the input they read.
LLAMA_QKV = ("q_proj", "k_proj", "v_proj")  # read the attention norm's output (H)
LLAMA_GATE_UP = ("gate_proj", "up_proj")  # read the MLP norm's output (H)
LLAMA_PROJECTIONS = (*LLAMA_QKV, "o_proj", *LLAMA_GATE_UP, "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-style decoder that its memory depends on (read from its config)."""

    vocab_size: int  #: V, rows of the (tied) embedding and width of the logits
    hidden_size: int  #: H, width of the residual stream
    intermediate_size: int  #: I, width of the MLP's gate/up outputs
    num_layers: int  #: n, decoder layers
    num_heads: int  #: query heads
    num_kv_heads: int  #: key/value heads (grouped-query attention)
    head_dim: int  #: width of one head
    tied_embeddings: bool  #: True when the LM head reuses the embedding matrix

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """From a Llama transformers config or a dict of its fields (`architecture_of(...)`)."""
        get = (config.get if isinstance(config, dict)
               else lambda key, default=None: getattr(config, key, default))
        if get("model_type") != "llama":
            raise ValueError("config must describe a Llama model (model_type 'llama'), got "
                             f"{get('model_type')!r}")
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        return cls(vocab_size=int(get("vocab_size")), hidden_size=hidden,
                   intermediate_size=int(get("intermediate_size")),
                   num_layers=int(get("num_hidden_layers")),
                   num_heads=heads, num_kv_heads=int(get("num_key_value_heads") or heads),
                   head_dim=int(get("head_dim") or hidden // heads),
                   tied_embeddings=bool(get("tie_word_embeddings", True)))

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        H, ffn = self.hidden_size, self.intermediate_size
        Ha, Hkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {"q_proj": (H, Ha), "k_proj": (H, Hkv), "v_proj": (H, Hkv), "o_proj": (Ha, H),
                "gate_proj": (H, ffn), "up_proj": (H, ffn), "down_proj": (ffn, H)}

    def parameter_count(self) -> int:
        """Parameters of the causal LM, shared embedding counted once:
        N = V H (1 + untied) + n (sum_proj in * out + 2 H) + H    (2 RMSNorms a layer, one final)"""
        H = self.hidden_size
        per_layer = sum(i * o for i, o in self.projection_shapes().values()) + 2 * H
        embeddings = self.vocab_size * H * (1 if self.tied_embeddings else 2)
        return embeddings + self.num_layers * per_layer + H

    def lora_parameter_count(self, r: int, targets: tuple[str, ...]) -> int:
        """Parameters of one LoRA adapter: A (r, in) + B (out, r) per wrapped projection."""
        unknown = set(targets) - set(LLAMA_PROJECTIONS)
        if unknown:
            raise ValueError(
                f"targets must be Llama projections {LLAMA_PROJECTIONS}, got {sorted(unknown)}")
        shapes = self.projection_shapes()
        return self.num_layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes alive together at the peak of one training stage; `total` is their sum."""

    stage: str  #: "sft", "reward" or "ppo"
    phase: str  #: the moment of the peak, e.g. "update" or "rollout scoring"
    weights: int  #: every parameter as stored: frozen base in its dtype, trained weights in float32
    autocast_copies: int  #: low-precision weight copies that autocast makes and backward keeps
    gradients: int  #: float32 gradients of the trained parameters
    optimizer_states: int  #: Adam's two float32 moments per trained parameter
    activations: int  #: tensors the forward saves for backward (or a no-grad layer's working set)
    logits: int  #: the (rows, positions, V) logits and their float32 copies alive at the peak
    kv_cache: int  #: keys and values of the sampling loop's growing cache (PPO rollouts only)
    sampler_buffers: int = 0  #: CUDA fast sampler's, all iteration: folded weights, static caches

    @property
    def total(self) -> int:
        """Sum of every part, bytes."""
        return (self.weights + self.autocast_copies + self.gradients + self.optimizer_states
                + self.activations + self.logits + self.kv_cache + self.sampler_buffers)


def _dtype_bytes(profile: Any) -> int:
    """Bytes per element of the profile's compute dtype ("auto" resolved for its device)."""
    return FLOAT32_BYTES if resolve_dtype(profile.dtype, profile.device) == "float32" else 2


def activation_bytes(shape: ModelShape, rows: int, seq_len: int, s: int, full: bool, autocast: bool,
                     lora_r: int = 0, lora_targets: tuple[str, ...] = ()) -> int:
    """Bytes a Llama forward over (rows, seq_len) tokens saves for backward, up to the final norm.

    s: bytes of the compute dtype; full: every weight trains (else only LoRA on `lora_targets`);
    autocast: float32 weights with low-precision arithmetic (else weights are in the s-byte dtype).
    Per token and layer (H, I, Ha = heads * head_dim, L = seq_len):
      norms      4 H + 4 each (RMSNorm's float32 input and 1/rms), + 4 H with trainable weights
      inputs     the copy of its input each trained projection keeps (see `_saved_inputs`)
      LoRA A     r numbers per wrapped projection (what B needs): float32, s bytes under autocast
      attention  q, k, v, output: 4 s Ha; log-sum-exp 4 per head; the (L, L) mask row: s L
      MLP        silu's input, its output and up: 3 s I
    plus the embedding's int64 ids (full only) and, once, RoPE's cos and sin (2 L head_dim).
    Norms: all 2n + 1 when the embedding trains, else 2n (the first one's input needs no gradient).
    Exact, to the byte, on torch 2.13 + transformers 5.23 (tests/runtime/test_precision.py counts
    the saved tensors of real forwards); the mask and RoPE terms depend on how transformers calls
    attention.
    """
    n, tokens = shape.num_layers, rows * seq_len
    Ha = shape.num_heads * shape.head_dim
    H = shape.hidden_size
    norm = FLOAT32_BYTES * H + FLOAT32_BYTES + (FLOAT32_BYTES * H if full else 0)
    norms = (2 * n + (1 if full else 0)) * norm  # (tokens,) each
    lora = 0 if full else len(lora_targets) * lora_r * (s if autocast else FLOAT32_BYTES)
    attention = 4 * s * Ha + FLOAT32_BYTES * shape.num_heads + s * seq_len
    mlp = 3 * s * shape.intermediate_size
    per_layer = _saved_inputs(shape, s, full, autocast, lora_targets) + lora + attention + mlp
    ids = INDEX_BYTES if full else 0
    rope = 2 * seq_len * shape.head_dim * (FLOAT32_BYTES if autocast else s)  # cos, sin (shared)
    return tokens * (n * per_layer + norms + ids) + rope


def _saved_inputs(shape: ModelShape, s: int, full: bool, autocast: bool,
                  lora_targets: tuple[str, ...]) -> int:
    """Bytes per token and layer of the projection inputs kept for the weight gradients.

    In float32 the projections reading one tensor share it (q/k/v read the attention norm's output,
    gate/up the MLP norm's; o reads attention's output, which attention keeps anyway). In low
    precision each projection casts its input and keeps its own copy: to float32 for a LoRA layer on
    a low-precision base (the adapter is float32), to s bytes under autocast. Under autocast o's and
    down's inputs are already low precision: o shares attention's output, down keeps MLP's product.
    """
    H, ffn = shape.hidden_size, shape.intermediate_size
    targets = LLAMA_PROJECTIONS if full else lora_targets
    width = {"o_proj": shape.num_heads * shape.head_dim, "down_proj": ffn}
    if s == FLOAT32_BYTES:  # one shared float32 input per group; o's is attention's saved output
        groups = [any(t in targets for t in LLAMA_QKV) * H,
                  any(t in targets for t in LLAMA_GATE_UP) * H, ("down_proj" in targets) * ffn]
        return FLOAT32_BYTES * sum(groups)
    element = s if autocast else FLOAT32_BYTES
    copies = sum(width.get(t, H) for t in targets if not (t == "o_proj" and full))
    return element * copies


def model_shape(profile: Any) -> ModelShape:
    """The shape of `profile.base_model` (`runtime.architectures.architecture_of`)."""
    return ModelShape.from_config(architecture_of(profile.base_model))


def estimate_sft_memory(profile: Any, shape: ModelShape | None = None) -> MemoryEstimate:
    """Peak of one full-SFT step (TRL SFTTrainer): sft_batch_size rows of max_length tokens.

    float32 masters with autocast in the compute dtype (precision.amp_flags): weights 4N, autocast's
    s-byte copies s N, gradients 4N, Adam 8N, saved activations, and one tile of TRL's fused LM
    head: at most TRL_TOKEN_TILE tokens x TRL_VOCAB_TILE vocabulary entries, its product in s bytes
    plus a float32 transform and a float32 gradient (the full (rows, L, V) logits are never built).
    """
    shape = shape or model_shape(profile)
    s, N = _dtype_bytes(profile), shape.parameter_count()
    rows, length = profile.sft_batch_size, profile.max_length
    tile = min(rows * length, TRL_TOKEN_TILE) * min(shape.vocab_size, TRL_VOCAB_TILE)
    autocast = s < FLOAT32_BYTES
    return MemoryEstimate(
        stage="sft", phase="update", weights=FLOAT32_BYTES * N,
        autocast_copies=s * N if autocast else 0,
        gradients=FLOAT32_BYTES * N, optimizer_states=2 * FLOAT32_BYTES * N,
        activations=activation_bytes(shape, rows, length, s, full=True, autocast=autocast),
        logits=tile * (s + 2 * FLOAT32_BYTES), kv_cache=0)


def estimate_reward_memory(profile: Any, shape: ModelShape | None = None) -> MemoryEstimate:
    """Peak of one reward-model step (TRL RewardTrainer, LoRA + score head): 2 x reward_batch_size
    rows (chosen and rejected in one forward) of max_length tokens.

    The classifier is float32 (base, LoRA, the score head and its modules_to_save copy: 2H), with
    autocast copies of the frozen weights kept for backward (at most s N); only LoRA and the head
    have gradients and Adam moments. No vocabulary logits: the head gives one number per position.
    """
    shape = shape or model_shape(profile)
    s, N, H = _dtype_bytes(profile), shape.parameter_count(), shape.hidden_size
    targets = tuple(profile.lora.target_modules)
    trained = shape.lora_parameter_count(profile.lora.r, targets) + H  # LoRA + score head (no bias)
    autocast = s < FLOAT32_BYTES
    return MemoryEstimate(
        stage="reward", phase="update", weights=FLOAT32_BYTES * (N + trained + H),
        autocast_copies=s * N if autocast else 0, gradients=FLOAT32_BYTES * trained,
        optimizer_states=2 * FLOAT32_BYTES * trained,
        activations=activation_bytes(shape, 2 * profile.reward_batch_size, profile.max_length, s,
                                     full=False, autocast=autocast, lora_r=profile.lora.r,
                                     lora_targets=targets),
        logits=0, kv_cache=0)


def ppo_phase_estimates(profile: Any, shape: ModelShape | None = None,
                        fast_sampling: bool | None = None) -> dict[str, MemoryEstimate]:
    """The three moments of one PPO iteration that can hold its peak, by name.

    Always alive: the base in the compute dtype (s N), three float32 LoRA adapters (policy, value,
    reward), the value head (H + 1) and the score head (H), both Adam optimisers' moments, and with
    `fast_sampling` (default: on CUDA, as `SharedLoRAModel` chooses for a Llama) the fast sampler's
    buffers (`sampler_bytes`).
    - "sampling": the KV cache, 2 (keys, values) x layers x kv_heads x head_dim numbers per token:
      plain sampler: rollout_batch_size x (max_prompt_length + max_new_tokens) tokens plus one
      layer's copy made while it grows; fast sampler: the prompt's, before it is copied into the
      static cache. One step's (B, V) logits in s bytes and three float32 copies (scaled, softmax,
      log-softmax).
    - "rollout scoring": log-probs of the whole rollout batch in one no-grad forward (reference, and
      the policy's own in low precision): (B, R, V) logits in s bytes, their float32 upcast and
      logsumexp's float32 temporary; one layer's MLP working set (gate, up, silu, product: 4 s I).
    - "update": a policy step on mini_batch_size rows: saved activations, the policy adapter's
      gradients and the (b, R, V) logits in s bytes with four float32 copies at the peak of
      backward: the saved upcast, exp(z - logsumexp) of logsumexp's backward, gather's scattered
      gradient and their sum (the entropy statistic's upcast, softmax and product at the forward's
      peak: as many).
    """
    shape = shape or model_shape(profile)
    s, N, H, V = _dtype_bytes(profile), shape.parameter_count(), shape.hidden_size, shape.vocab_size
    targets = tuple(profile.lora.target_modules)
    lora = shape.lora_parameter_count(profile.lora.r, targets)
    ppo = profile.ppo
    B, b, R, P = (ppo.rollout_batch_size, ppo.mini_batch_size, ppo.max_new_tokens,
                  ppo.max_prompt_length)
    if fast_sampling is None:
        fast_sampling = str(profile.device).startswith("cuda")
    resident = {"weights": s * N + FLOAT32_BYTES * (3 * lora + 2 * H + 1), "autocast_copies": 0,
                "optimizer_states": 2 * FLOAT32_BYTES * (2 * lora + H + 1),
                "sampler_buffers": sampler_bytes(shape, profile, s) if fast_sampling else 0}
    per_token_kv = 2 * shape.num_kv_heads * shape.head_dim * s  # one token's keys, values, a layer
    if fast_sampling:  # the prompt's cache of the model's own forward, copied into the static cache
        kv = B * P * per_token_kv * shape.num_layers
    else:  # (B, kv_heads, P + R, head_dim) x 2 per layer, and one layer's copy as it grows
        kv = B * (P + R) * per_token_kv * (shape.num_layers + 1)
    return {
        "sampling": MemoryEstimate(stage="ppo", phase="sampling", **resident,
                                   gradients=0, activations=0,
                                   logits=B * V * (s + 3 * FLOAT32_BYTES), kv_cache=kv),
        "rollout scoring": MemoryEstimate(
            stage="ppo", phase="rollout scoring", **resident, gradients=0,
            activations=B * (P + R) * 4 * s * shape.intermediate_size,
            logits=B * R * V * (s + 2 * FLOAT32_BYTES), kv_cache=0),
        "update": MemoryEstimate(
            stage="ppo", phase="update", **resident, gradients=FLOAT32_BYTES * lora,
            activations=activation_bytes(shape, b, P + R, s, full=False, autocast=False,
                                         lora_r=profile.lora.r, lora_targets=targets),
            logits=b * R * V * (s + 4 * FLOAT32_BYTES), kv_cache=0),
    }


def sampler_bytes(shape: ModelShape, profile: Any, s: int) -> int:
    """The CUDA fast sampler's buffers (ppo/model/fast_decoder.py), kept from one iteration to the
    next: every projection weight with the sampling adapter folded in (s bytes each), and the
    static KV caches of up to MAX_GRAPHS (batch, width) entries, width = max_prompt_length +
    max_new_tokens rounded up to CACHE_ROUND, batch = the larger of the rollout and evaluation
    batches."""
    folded = s * shape.num_layers * sum(i * o for i, o in shape.projection_shapes().values())
    tokens = profile.ppo.max_prompt_length + profile.ppo.max_new_tokens
    width = -(-tokens // CACHE_ROUND) * CACHE_ROUND
    batch = max(profile.ppo.rollout_batch_size, profile.ppo.eval_batch_size)
    cache = batch * width * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * s
    return folded + MAX_GRAPHS * cache


def estimate_ppo_memory(profile: Any, shape: ModelShape | None = None,
                        fast_sampling: bool | None = None) -> MemoryEstimate:
    """Peak of one PPO iteration: the largest of `ppo_phase_estimates`."""
    phases = ppo_phase_estimates(profile, shape, fast_sampling)
    return max(phases.values(), key=lambda estimate: estimate.total)


def estimate_memory(profile: Any, shape: ModelShape | None = None) -> dict[str, MemoryEstimate]:
    """Estimated peak GPU memory of the profile's full SFT, reward-model and PPO steps, by stage."""
    shape = shape or model_shape(profile)
    return {"sft": estimate_sft_memory(profile, shape),
            "reward": estimate_reward_memory(profile, shape),
            "ppo": estimate_ppo_memory(profile, shape)}
