"""Loading checkpoints as diffusion LMs. The names below load on first use (PEP 562), so that importing a leaf
module (``models.diffusion_config``) does not load ``models.auto`` and, through it, the generation mixin."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AutoModelForDiffusionLM": ".auto",
    "add_diffusion_generation": ".auto",
    "convert_checkpoint": ".convert",
    "DiffusionConfig": ".diffusion_config",
}

__all__ = ["AutoModelForDiffusionLM", "DiffusionConfig", "add_diffusion_generation", "convert_checkpoint"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .auto import AutoModelForDiffusionLM, add_diffusion_generation
    from .convert import convert_checkpoint
    from .diffusion_config import DiffusionConfig
