"""Scalar heads on a backbone's last hidden state: the critic's value head and reward score head."""

from __future__ import annotations

import torch
from torch import nn


class ScalarHead(nn.Module):
    """h (B, T, H) -> one number per position (B, T): a single Linear(H, 1).

    The value head is this on the value adapter's hidden states (V(s_t) at every position); the
    reward score head is this on the reward adapter's hidden states, read at the last real token.
    """

    def __init__(self, hidden_size: int, bias: bool = True, init_std: float | None = None) -> None:
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        self.linear = nn.Linear(hidden_size, 1, bias=bias)  #: the head's only layer
        if init_std is not None:
            # small weights and zero bias: the critic starts near V = 0 instead of a random offset
            nn.init.normal_(self.linear.weight, std=init_std)
            if bias:
                nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[-1] != self.linear.in_features:
            raise ValueError(f"hidden must have last dimension {self.linear.in_features}, got "
                             f"{tuple(hidden.shape)}")
        # float32 head on (possibly bf16) hidden states: values and scores keep their digits
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)  # (B, T)
