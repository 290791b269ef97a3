"""The attention masks, re-exported from :mod:`t3d_trl.diffusion.masks` (their home beneath ``generation``)."""

from ..diffusion.masks import (
    additive_mask,
    block_attention_mask,
    padding_attention_mask,
    position_ids_from_valid,
)

__all__ = ["additive_mask", "block_attention_mask", "padding_attention_mask", "position_ids_from_valid"]
