"""The sampler's CUDA fast path: a Llama-family decode step over a static KV cache, as a CUDA graph.

    decoder = StaticLlamaDecoder(lm)             # once per model (SharedLoRAModel keeps one)
    decoder.load_adapter("policy")               # fold W' = W + s B A into its weight buffers
    out = sampling.sample(lm, ids, attn, 48, eos_token_id=..., pad_token_id=..., decoder=decoder)

Why: a decode step of a 135M model at batch 32 is ~1,000 tiny kernels (30 layers; each LoRA
projection alone is three products, a scale and an add). Launched one by one from Python they cost
far more than the GPU needs to read the weights once (benchmarks/README.md: 26 ms per step for
`generate` on an H100 against a ~0.09 ms bandwidth floor). Here every LoRA adapter is folded into a
copy of its base weight (one product per projection), the KV cache has a static shape, and the whole
step is captured once as a CUDA graph and replayed for every token: one launch per step. The token
inputs, the cache column and the attention mask live in static buffers the graph reads. On a CPU
(tests) the same step runs eagerly; there it must give the plain loop's tokens and log-probs
(tests/ppo/test_sampling.py).

The prompt (prefill) goes through the model's own forward, with the adapter the caller activated;
its keys and values are copied into the static cache.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from rlhf_helpers.core.tokens import position_ids_from_mask

#: Model types whose decode step `StaticLlamaDecoder` implements (SmolLM2 is a Llama).
FAST_MODEL_TYPES = ("llama",)
#: Static-cache widths are rounded up to a multiple of this, so nearby prompt widths share a graph.
CACHE_ROUND = 32
#: Graph entries (batch size, cache width) kept per decoder; each holds its own KV cache.
MAX_GRAPHS = 2


def supports_fast_decoder(lm: nn.Module) -> bool:
    """True when `lm` is a Llama-family causal LM that `StaticLlamaDecoder` can run."""
    config = getattr(lm, "config", None)
    return getattr(config, "model_type", None) in FAST_MODEL_TYPES and hasattr(lm, "model") \
        and hasattr(lm.model, "layers") and hasattr(lm.model, "rotary_emb")


def _cache_layers(past: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of every layer of a transformers cache, each (B, n_kv, P, d)."""
    if hasattr(past, "layers"):  # transformers >= 4.56: one object per layer
        return [(layer.keys, layer.values) for layer in past.layers]
    return list(zip(past.key_cache, past.value_cache, strict=True))  # older caches


def _effective_weight(module: nn.Module,
                      adapter: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight (out, in), bias) of a linear layer, with `adapter`'s LoRA folded in: W + s B A.

    `adapter=None` (the reference) or a layer without that adapter gives the base weight itself.
    """
    base = getattr(module, "base_layer", module)
    if adapter is None or adapter not in getattr(module, "lora_A", {}):
        return base.weight, base.bias
    lora_a = module.lora_A[adapter].weight  # (r, in)
    lora_b = module.lora_B[adapter].weight  # (out, r)
    scaling = float(module.scaling[adapter])
    # W' = W + s B A, computed in float32 and rounded once to the base's dtype
    merged = torch.addmm(base.weight.float(), lora_b.float(), lora_a.float(),
                         alpha=scaling)  # (out, in)
    return merged.to(base.weight.dtype), base.bias


_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _projection(layer: nn.Module, name: str) -> nn.Module:
    """A decoder layer's projection by name: attention ones first, then the MLP's."""
    owner = layer.self_attn if name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp
    return getattr(owner, name)


class _GraphEntry:
    """The static buffers of one (batch, cache width): inputs, KV cache, output, and the graph."""

    def __init__(self, batch: int, width: int, n_layers: int, n_kv: int, head_dim: int, vocab: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.token = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
        self.position = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # (1,) this token's column
        self.mask = torch.zeros(batch, width, dtype=torch.bool,
                                device=device)  # (B, W) attended keys
        shape = (batch, n_kv, width, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.logits: torch.Tensor | None = None  #: (B, V) output buffer of the captured step
        self.graph: Any = None
        self.verified = False  #: the first replay was checked against the same step run eagerly


class StaticLlamaDecoder:
    """The decode step of a Llama-family model over a static KV cache, replayed as a CUDA graph.

    Built once per model and kept (`SharedLoRAModel` holds one); every `start` folds the chosen
    adapter into the persistent weight buffers in place, so captured graphs stay valid. Prefill
    uses the model's own forward; its keys and values are copied into the static cache.
    """

    def __init__(self, lm: nn.Module, use_graphs: bool | None = None) -> None:
        if not supports_fast_decoder(lm):
            raise ValueError(f"the fast decoder needs a model of type {FAST_MODEL_TYPES}, got "
                             f"{getattr(getattr(lm, 'config', None), 'model_type', None)!r}")
        self.lm = lm
        config = lm.config
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.layers = list(lm.model.layers)
        device = lm.model.embed_tokens.weight.device
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        # persistent copies of every projection weight: refreshed in place by `start`
        self.weights: list[dict[str, tuple[torch.Tensor, torch.Tensor | None]]] = []
        for layer in self.layers:
            found = {}
            for name in _PROJECTIONS:
                weight, bias = _effective_weight(_projection(layer, name), None)
                found[name] = (weight.detach().clone(), bias)
            self.weights.append(found)
        self.entries: dict[tuple[int, int], _GraphEntry] = {}
        self.entry: _GraphEntry | None = None
        self.next_column = 0

    # -------------------------------------------------------------- weights
    @torch.no_grad()
    def load_adapter(self, adapter: str | None) -> None:
        """Fold `adapter` (None: no adapter, the reference) into the weight buffers, in place."""
        for layer, buffers in zip(self.layers, self.weights, strict=True):
            for name in _PROJECTIONS:
                weight, _ = _effective_weight(_projection(layer, name), adapter)
                buffers[name][0].copy_(weight)

    # -------------------------------------------------------------- the step itself
    def _linear(self, x: torch.Tensor, layer: int, name: str) -> torch.Tensor:
        weight, bias = self.weights[layer][name]
        return F.linear(x, weight, bias)

    def _step(self, entry: _GraphEntry) -> torch.Tensor:
        """One decode step on `entry`'s buffers: token (B,) at `column` -> logits (B, V)."""
        model = self.lm.model
        B = entry.token.shape[0]
        nh, nkv, d = self.n_heads, self.n_kv, self.head_dim
        h = model.embed_tokens(entry.token)[:, None]  # (B, 1, H)
        cos, sin = model.rotary_emb(h, entry.position[:, None])  # (B, 1, d) each
        keep = entry.mask[:, None, None, :]  # (B, 1, 1, W): True = attend
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)  # (B, 1, H)
            q = self._linear(x, i, "q_proj").view(B, 1, nh, d).transpose(1, 2)  # (B, nh, 1, d)
            k = self._linear(x, i, "k_proj").view(B, 1, nkv, d).transpose(1, 2)  # (B, nkv, 1, d)
            v = self._linear(x, i, "v_proj").view(B, 1, nkv, d).transpose(1, 2)  # (B, nkv, 1, d)
            q, k = _rotate(q, k, cos, sin)
            entry.keys[i].index_copy_(2, entry.column, k)  # write this token's key at its column
            entry.values[i].index_copy_(2, entry.column, v)
            # softmax(q K^T * scaling + mask) V over the cached columns (grouped-query heads)
            attn = F.scaled_dot_product_attention(q, entry.keys[i], entry.values[i], attn_mask=keep,
                                                  scale=layer.self_attn.scaling,
                                                  enable_gqa=nh != nkv)  # (B, nh, 1, d)
            h = h + self._linear(attn.transpose(1, 2).reshape(B, 1, -1), i, "o_proj")  # (B, 1, H)
            x = layer.post_attention_layernorm(h)
            act = layer.mlp.act_fn
            gated = act(self._linear(x, i, "gate_proj")) * self._linear(x, i, "up_proj")
            h = h + self._linear(gated, i, "down_proj")  # (B, 1, H)
        return self.lm.lm_head(model.norm(h))[:, 0]  # (B, V)

    def _entry_for(self, batch: int, width: int) -> _GraphEntry:
        key = (batch, width)
        if key not in self.entries:
            if len(self.entries) >= MAX_GRAPHS:  # free the oldest graph and its cache
                self.entries.pop(next(iter(self.entries)))
            config = self.lm.config
            weight = self.lm.model.embed_tokens.weight
            entry = _GraphEntry(batch, width, len(self.layers), self.n_kv, self.head_dim,
                                config.vocab_size, weight.dtype, weight.device)
            if self.use_graphs:
                entry.column.fill_(width - 1)  # warm-up and capture write a column no prompt uses
                entry.mask[:, 0] = True  # no all-masked row while capturing
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up: lazy initialisations and kernel selection
                        self._step(entry)
                torch.cuda.current_stream().wait_stream(stream)
                entry.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(entry.graph):
                    entry.logits = self._step(entry)
            self.entries[key] = entry
        return self.entries[key]

    # -------------------------------------------------------------- the decoder interface
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        """Prompt pass with the model's own forward (adapter as set by the caller); copies its keys
        and values into the static cache: (B, P) -> logits of the first response token (B, V)."""
        B, P = input_ids.shape
        width = -(-(P + max_new_tokens) // CACHE_ROUND) * CACHE_ROUND
        entry = self._entry_for(B, width)
        mask = attention_mask.long()
        last = torch.tensor([P - 1], device=input_ids.device)
        out = self.lm(input_ids=input_ids, attention_mask=mask,
                      position_ids=position_ids_from_mask(mask),
                      use_cache=True, logits_to_keep=last)
        for i, (keys, values) in enumerate(_cache_layers(out.past_key_values)):
            entry.keys[i][:, :, :P].copy_(keys)  # (B, nkv, P, d)
            entry.values[i][:, :, :P].copy_(values)
        entry.mask.zero_()
        entry.mask[:, :P].copy_(attention_mask.bool())
        self.entry, self.next_column = entry, P
        return out.logits[:, -1]  # (B, V)

    @torch.no_grad()
    def decode(self, token: torch.Tensor, position: torch.Tensor,
               keep: torch.Tensor) -> torch.Tensor:
        """As `PlainDecoder.decode`: token (B,), position (B,), keep (B,) bool -> logits (B, V)."""
        entry = self.entry
        column = self.next_column
        entry.token.copy_(token)
        entry.position.copy_(position)
        entry.column.fill_(column)
        entry.mask[:, column].copy_(keep)
        self.next_column += 1
        if entry.graph is None:
            return self._step(entry)
        entry.graph.replay()
        logits = entry.logits.clone()  # the next replay overwrites the buffer
        if not entry.verified:
            entry.verified = True
            return self._check_first_replay(entry, logits)
        return logits

    def _check_first_replay(self, entry: _GraphEntry, replayed: torch.Tensor) -> torch.Tensor:
        """The first replay of a graph against the same step run eagerly (it rewrites the same cache
        column with the same keys and values). A graph replays the kernels it captured on the same
        buffers, so the two agree to rounding; a capture that read a stale or wrong buffer would
        give logits off by their own size. Then graphs are dropped, with a warning, and this decoder
        runs eagerly: slower, never wrong."""
        eager = self._step(entry)  # (B, V)
        # 5% of the largest logit: far over bf16 rounding in 30 layers, far under a wrong buffer
        tolerance = 0.05 * float(eager.float().abs().max()) + 1e-3
        error = float((replayed.float() - eager.float()).abs().max())
        if not error <= tolerance:
            warnings.warn(
                f"the CUDA graph of the fast decoder gave logits {error:.3g} away from the same "
                f"step run eagerly (tolerance {tolerance:.3g}); it now runs without graphs",
                RuntimeWarning, stacklevel=3)
            self.use_graphs = False
            for other in self.entries.values():
                other.graph = None
            return eager
        return replayed


def _rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary position embedding (RoPE), as Llama applies it: x cos + rotate_half(x) sin."""
    return apply_rotary_pos_emb(q, k, cos, sin)
