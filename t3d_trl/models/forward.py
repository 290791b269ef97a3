"""The forward helpers, re-exported from :mod:`t3d_trl.diffusion.forward` (their home beneath ``generation``)."""

from ..diffusion.forward import accepts_4d_mask, cache_keyword, diffusion_forward, unwrap_model

__all__ = ["accepts_4d_mask", "cache_keyword", "diffusion_forward", "unwrap_model"]
