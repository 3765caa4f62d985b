"""The sampler's GPT-2 decode step: a preallocated KV cache, the model's own layers called directly.

    decoder = GPT2CacheDecoder(shared.lm)          # a fresh one per sampling call
    out = sampling.sample(shared.lm, ids, attn, 48, eos_token_id=..., pad_token_id=...,
                          decoder=decoder)

transformers' forward costs a decode step of the tiny model more than its arithmetic: its
dynamic cache concatenates every layer's keys and values with one more column at each token,
and each call walks its masks, output wrappers and configuration. Here the cache is allocated
once for the prompt plus `max_new_tokens` columns and each step writes one column of it.
Attention reads the keys in any order (a token's place is in its position embedding), so the
prompt's keys sit left-aligned, as `packed_gpt2.packed_hidden` hands them over from the prompt
pass, and each new token's after them. The step calls the model's own modules (layer norms, the
LoRA projections with whatever adapter is active, GELU), so it computes what the model's forward
computes, to float rounding (tests/ppo/test_packed_gpt2.py).

GPT-2 only (`packed_gpt2.supports_packed`); other models use `sampling.PlainDecoder`.
"""

from __future__ import annotations

import torch
from torch import nn

from rlhf_helpers.ppo.model.packed_gpt2 import attention, packed_hidden


class GPT2CacheDecoder:
    """Prompt pass and one-token steps of a GPT-2 LM over a static KV cache (`sampling.Decoder`)."""

    def __init__(self, lm: nn.Module) -> None:
        self.lm = lm
        self.transformer = lm.transformer
        self.keys: list[torch.Tensor] = []  #: per block (B, nh, W, d)
        self.values: list[torch.Tensor] = []  #: per block (B, nh, W, d)
        self.mask: torch.Tensor | None = None  #: (B, 1, 1, W) True = an attended key
        self.column = 0  #: the cache column the next token is written to

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        """Prompt pass: (B, P) -> logits of the first response token (B, V). The cache gets W +
        max_new_tokens columns (W: the longest prompt), row b's prompt keys and values in its first
        columns (left-aligned, as `packed_hidden` hands them over), the new tokens after W."""
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden = packed_hidden(self.transformer, input_ids, attention_mask, kv)  # (B, P, H)
        B, heads, W, d = kv[0][0].shape
        for k, v in kv:  # (B, nh, W, d) each
            empty = (B, heads, max_new_tokens, d)  # the R new columns
            self.keys.append(torch.cat([k, k.new_zeros(empty)], dim=2))  # (B, nh, W + R, d)
            self.values.append(torch.cat([v, v.new_zeros(empty)], dim=2))
        lengths = attention_mask.sum(dim=1)  # (B,) real prompt tokens per row
        columns = torch.arange(W + max_new_tokens, device=input_ids.device)  # (W + R,)
        self.mask = (columns[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, W + R)
        self.column = W
        return self.lm.lm_head(hidden[:, -1])  # (B, V): left padding puts every prompt's end last

    @torch.no_grad()
    def decode(self, token: torch.Tensor, position: torch.Tensor,
               keep: torch.Tensor) -> torch.Tensor:
        """token, position, keep (B,) -> logits of the next token (B, V); `keep` False: the row has
        ended and this token is not attended (as `sampling.PlainDecoder.decode`)."""
        column = self.column
        self.mask[:, 0, 0, column] = keep
        self.column += 1
        t = self.transformer
        B = token.shape[0]
        dtype = t.wte.weight.dtype
        bias = torch.zeros(self.mask.shape, dtype=dtype, device=token.device)  # (B, 1, 1, W + R)
        bias.masked_fill_(~self.mask, float("-inf"))  # 0 on attended keys, -inf elsewhere
        x = t.wte(token) + t.wpe(position)  # (B, H)
        for block, keys, values in zip(t.h, self.keys, self.values, strict=True):
            attn = block.attn
            q, k, v = attn.c_attn(block.ln_1(x)).split(attn.split_size, dim=-1)  # (B, H) each
            keys[:, :, column] = k.view(B, -1, attn.head_dim)  # (B, nh, d) into this token's column
            values[:, :, column] = v.view(B, -1, attn.head_dim)
            q = q.view(B, -1, 1, attn.head_dim)  # (B, nh, 1, d)
            # a = softmax(q K^T * scaling + mask) V over the written, attended columns
            a = attention(q, keys[:, :, : column + 1], values[:, :, : column + 1],
                          bias[..., : column + 1], attn.scaling)  # (B, nh, 1, d)
            x = x + attn.c_proj(a.reshape(B, -1))  # (B, H)
            x = x + block.mlp.c_proj(block.mlp.act(block.mlp.c_fc(block.ln_2(x))))  # (B, H)
        return self.lm.lm_head(t.ln_f(x))  # (B, V)
