"""Few-step diffusion decoding: the settings, the sampler and the mixin that gives models ``diffusion_generate``.

The names below load on first use (PEP 562): ``generation.configuration`` imports without torch, so that the
command line builds its decoding flags from :class:`DiffusionGenerationConfig` without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "DiffusionGenerationConfig": ".configuration",
    "DiffusionGenerationMixin": ".mixin",
    "DiffusionGenerationOutput": ".sampler",
}

__all__ = ["DiffusionGenerationConfig", "DiffusionGenerationMixin", "DiffusionGenerationOutput"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .configuration import DiffusionGenerationConfig
    from .mixin import DiffusionGenerationMixin
    from .sampler import DiffusionGenerationOutput
