"""The diffusion description, re-exported from :mod:`t3d_trl.diffusion.config` (its home beneath ``generation``)."""

from ..diffusion.config import ATTENTION_KINDS, CONFIG_KEY, DiffusionConfig, require_diffusion_config

__all__ = ["ATTENTION_KINDS", "CONFIG_KEY", "DiffusionConfig", "require_diffusion_config"]
