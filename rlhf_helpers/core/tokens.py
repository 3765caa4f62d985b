"""Token-mask helpers shared by the samplers, the experience code and the fast decoder.

    position_ids_from_mask(attention_mask)   # (B, L) positions over real tokens, 0 at left padding
    mask_to_first_eos(responses, eos_id)     # (B, R) 1 up to and including each row's first EOS
    last_token_index(mask)                   # (B,) index of each row's last real token (-1: none)
"""

from __future__ import annotations

import torch

from rlhf_helpers.core.checks import check_mask, check_mask_contiguous, check_ndim, check_nonempty


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only: (B, L) 0/1 mask -> (B, L), 0 at left padding.

    pos_t = (sum_{s <= t} m_s) - 1, clamped at 0; a left-padded row starts at position 0 on its
    first real token, exactly as the same row without padding would.
    """
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, L)


def mask_to_first_eos(responses: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on each sampled token up to and including the first EOS, 0 after: (B, R) -> (B, R) float.

    Built from EOS alone, not from the pad id: the loop writes pad only after a row's EOS, so a pad
    token the policy itself sampled mid-response (possible with a small vocabulary) stays a real,
    attended token instead of punching a hole into the mask.
    """
    is_eos = (responses == eos_token_id).long()  # (B, R)
    after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0  # (B, R): strictly after the first EOS
    return (~after_eos).float()  # (B, R)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token in a contiguous (B, T) mask: (B,), -1 for an empty row.

    mask must be (B, T) with T >= 1, hold only 0 and 1, and be one block of ones per row.
    """
    check_ndim("mask", mask, 2, "(B, T)")
    check_nonempty("mask", mask)
    check_mask("mask", mask, "mask", mask)
    check_mask_contiguous("mask", mask)
    return _last_token_index(mask)


def _last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """`last_token_index` for an already validated mask."""
    T = mask.shape[1]
    flipped_first = torch.flip(mask.to(torch.int8), dims=[1]).argmax(dim=1)  # (B,)
    last = T - 1 - flipped_first  # (B,)
    return torch.where(mask.bool().any(dim=1), last, torch.full_like(last, -1))
