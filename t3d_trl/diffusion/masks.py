"""Additive float attention masks for running decoders as diffusion models.

Native transformers decoders (Llama, Qwen2, Qwen3, Mistral, ...) accept a 4D float mask of shape
``[batch, 1, q_len, k_len]`` where 0 means "attend" and ``finfo.min`` means "blocked". A boolean 4D mask is
silently wrong under eager attention, so everything here returns float masks.

Positions are described by two per-key tensors: ``valid`` (1 for real tokens, 0 for padding) and ``block``
(the attention block of each position). A query attends a key when the key is valid and the key's block is
not later than the query's. Bidirectional attention is the special case where every position is in block 0.
A query always attends itself, so rows of padding never produce NaNs.
"""

from __future__ import annotations

import torch


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Turn a boolean ``[B, Lq, Lk]`` "may attend" tensor into a ``[B, 1, Lq, Lk]`` additive float mask."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


def block_attention_mask(
    query_block: torch.Tensor,
    key_block: torch.Tensor,
    key_valid: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Additive mask where a query sees every valid key of its own or an earlier block.

    Args:
        query_block: ``[B, Lq]`` block id of each query.
        key_block: ``[B, Lk]`` block id of each key.
        key_valid: ``[B, Lk]`` bool, False for padding keys.
        dtype: float dtype of the mask (the model's compute dtype).

    The queries are the last ``Lq`` keys, and every query sees itself (a padded query keeps a finite row).
    """
    allowed = (key_block.unsqueeze(1) <= query_block.unsqueeze(2)) & key_valid.bool().unsqueeze(1)
    lq, lk = query_block.shape[1], key_block.shape[1]
    query_index = torch.arange(lk - lq, lk, device=allowed.device)
    key_index = torch.arange(lk, device=allowed.device)
    allowed |= (query_index.unsqueeze(1) == key_index.unsqueeze(0)).unsqueeze(0)
    return additive_mask(allowed, dtype)


def padding_attention_mask(key_valid: torch.Tensor, query_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Bidirectional additive mask ``[B, 1, Lq, Lk]`` that only hides padding keys (queries are the last Lq keys)."""
    zeros_q = torch.zeros(key_valid.shape[0], query_len, dtype=torch.long, device=key_valid.device)
    zeros_k = torch.zeros_like(key_valid, dtype=torch.long)
    return block_attention_mask(zeros_q, zeros_k, key_valid, dtype)


def position_ids_from_valid(valid: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only (left padding gets position 0), like ``cumsum(mask) - 1``."""
    return (valid.long().cumsum(-1) - 1).clamp_min(0)
