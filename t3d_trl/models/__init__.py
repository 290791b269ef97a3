"""Loading checkpoints as diffusion LMs. The names below load on first use (PEP 562), so that importing a leaf
module (``models.diffusion_config``) does not load ``models.auto`` and, through it, the generation mixin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..utils import lazy_exports

_EXPORTS = {
    "AutoModelForDiffusionLM": ".auto",
    "add_diffusion_generation": ".auto",
    "convert_checkpoint": ".convert",
    "DiffusionConfig": ".diffusion_config",
}

__all__ = ["AutoModelForDiffusionLM", "DiffusionConfig", "add_diffusion_generation", "convert_checkpoint"]


__getattr__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from .auto import AutoModelForDiffusionLM, add_diffusion_generation
    from .convert import convert_checkpoint
    from .diffusion_config import DiffusionConfig
