"""GPT-2's forward on the real tokens only: the same layers, no work spent on padding.

    if supports_packed(lm):
        hidden = packed_hidden(lm.transformer, input_ids, attention_mask)  # (B, L, H), 0 at pads

A PPO batch is padded on both sides: prompts on the left to the longest prompt, responses on
the right to the longest response. In the tiny profile about a quarter of a minibatch's
positions are padding, and transformers' forward runs every linear layer, layer norm and GELU
on them too. Here the N real tokens of the batch are gathered into one (N, H) block first,

    x = wte(ids[real]) + wpe(pos[real])                                  (N, H)

and every position-wise layer (layer norms, the c_attn/c_proj/c_fc products with their LoRA
adapters, GELU) runs on that block. Only attention needs the rows apart: the queries, keys and
values are scattered into a (B, W) grid, row b's k-th real token in column k (W: the longest
row), for one causal softmax per row,

    a = softmax(q k^T / sqrt(d) + causal mask) v

and gathered again. Left-aligned this way, the keys up to a real query are exactly its row's
real tokens up to it, so the causal mask is the padding mask too (the empty cells after a
row's end are read only by empty queries, whose outputs are dropped).

Each real token's output is the same function of the same inputs as in transformers' forward
(equal to float rounding, tests/ppo/test_packed_gpt2.py); padding positions get a hidden state of 0,
which nothing reads (every loss masks them). The layers are the model's own modules, called on
the (N, H) block, so the active LoRA adapter, `reference()` (adapters disabled) and the fused
LoRA layers work unchanged. GPT-2 only; `supports_packed` says when it applies (elsewhere
`SharedLoRAModel` keeps transformers' forward).
"""

from __future__ import annotations

import torch
from torch import nn

from rlhf_helpers.core.tokens import position_ids_from_mask


def supports_packed(lm: nn.Module) -> bool:
    """True when `lm` is a GPT-2 LM whose blocks `packed_hidden` computes exactly (eval mode: no
    dropout; plain scaled attention; no cross-attention)."""
    config = getattr(lm, "config", None)
    if getattr(config, "model_type", None) != "gpt2" or not hasattr(lm, "transformer"):
        return False
    return (not config.add_cross_attention and not config.scale_attn_by_inverse_layer_idx
            and not config.reorder_and_upcast_attn and config.scale_attn_weights
            and not lm.training)


def causal_bias(width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(W, W) additive mask: 0 where key j <= query i, -inf after it."""
    return torch.full((width, width), float("-inf"), dtype=dtype, device=device).triu(1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
              scaling: float) -> torch.Tensor:
    """softmax(q k^T * scaling + bias) v: q (B, nh, Q, d), k and v (B, nh, K, d) -> (B, nh, Q, d);
    bias broadcasts to (B, nh, Q, K).

    Three batched products instead of `F.scaled_dot_product_attention`: at GPT-2-tiny sizes (head
    dimension 32, under 50 positions) torch's fused CPU kernel is about 25% slower, forward and
    backward (benchmarks/README.md). Every row of `bias` must allow at least one key."""
    B, heads, Q, d = q.shape
    if bias.dim() > 2:  # one mask per row: (B nh, Q, K); a (Q, K) mask broadcasts as it is
        bias = bias.expand(B, heads, Q, k.shape[2]).reshape(B * heads, Q, k.shape[2])
    keys_t = k.reshape(B * heads, -1, d).transpose(1, 2)  # (B nh, d, K)
    scores = torch.baddbmm(bias, q.reshape(B * heads, Q, d), keys_t, alpha=scaling)  # (B nh, Q, K)
    # a 16-bit softmax in float32, as torch's fused kernel computes it
    weights = torch.softmax(scores.float() if scores.element_size() < 4 else scores, dim=-1)
    weights = weights.to(v.dtype)  # (B nh, Q, K)
    return torch.bmm(weights, v.reshape(B * heads, -1, d)).view(B, heads, Q, d)


def _attention(block: nn.Module, x: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor],
               grid: tuple[int, int], causal: torch.Tensor,
               kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
    """Causal self-attention of one block on packed rows: x (N, H) -> (N, H).

    `slots` (row, column) place each packed token in a (B, W) grid, `grid` = (B, W), `causal` is
    `causal_bias(W)`. `kv`: the block's keys and values (B, nh, W, d) are appended to it."""
    attn = block.attn
    qkv = attn.c_attn(x)  # (N, 3H)
    # out of place: autograd sends each grid cell's gradient back to its packed row
    cells = qkv.new_zeros(*grid, qkv.shape[-1]).index_put(slots, qkv)  # (B, W, 3H); empty: 0
    q, k, v = cells.split(attn.split_size, dim=2)  # (B, W, H) each
    q, k, v = (t.view(*grid, -1, attn.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, W, d)
    if kv is not None:
        kv.append((k, v))
    # a token's earlier columns are its row's earlier tokens: the causal mask masks padding too
    out = attention(q, k, v, causal, attn.scaling)  # (B, nh, W, d)
    out = out.transpose(1, 2).reshape(*grid, -1)[slots]  # (N, H): the real tokens again
    return attn.c_proj(out)  # (N, H)


def packed_hidden(transformer: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
    """The last hidden state of GPT-2's transformer (ln_f applied) at every real token:
    (B, L) ids and 0/1 mask -> (B, L, H), with 0 at the padding positions. `kv`: each block's keys
    and values are appended to it, left-aligned: row b's k-th real token in column k (the prompt
    pass of `gpt2_decoder`)."""
    real = attention_mask.bool()  # (B, L)
    positions = position_ids_from_mask(attention_mask)  # (B, L): counted over real tokens
    rows, _ = real.nonzero(as_tuple=True)  # (N,), in the order of x[real] below
    columns = positions[real]  # (N,): a token's place among its row's real tokens
    width = int(columns.max()) + 1 if len(columns) else 1  # W, the longest row
    grid = (real.shape[0], width)  # (B, W)
    x = transformer.wte(input_ids[real]) + transformer.wpe(columns)  # (N, H)
    causal = causal_bias(grid[1], x.dtype, x.device)  # (W, W)
    for block in transformer.h:
        x = x + _attention(block, block.ln_1(x), (rows, columns), grid, causal, kv)  # (N, H)
        x = x + block.mlp.c_proj(block.mlp.act(block.mlp.c_fc(block.ln_2(x))))  # (N, H)
    x = transformer.ln_f(x)  # (N, H)
    hidden = x.new_zeros(*real.shape, x.shape[-1])  # (B, L, H)
    return hidden.index_put((real,), x)
